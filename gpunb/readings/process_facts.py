"""What this machine says about one process (psutil and ``/proc``), to name a GPU process.

NVML gives only a PID. Here a PID becomes a name, an owner, its parent chain (so a
DataLoader worker or a spawned training process can be traced to its notebook kernel), the
Jupyter kernel id when the command line names a kernel connection file, and which NVIDIA
device files it holds open.

The device files also tell whether a PID that NVML reports is really the process seen
here: inside a container without the host's PID namespace NVML reports *host* PIDs, and
the same number may belong to an unrelated local process. A process with a CUDA context
always holds ``/dev/nvidia*`` open; a local process that does not is not the one NVML means.

Nothing here raises: a process that is gone, hidden (``hidepid``) or not readable gives a
record that says what could not be known.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

# jupyter_client names connection files ``kernel-<id>.json``; the launcher gets ``-f <file>``.
_KERNEL_FILE = re.compile(r"kernel-([0-9A-Za-z][0-9A-Za-z_.-]*)\.json$")
# CUDA opens the unified-memory device (``nvidia-uvm``) on init; NVML alone (a monitor,
# this server) opens only ``nvidiactl`` and ``nvidiaN``.
CUDA_DEVICE_NAME = "nvidia-uvm"
# Tests that replay a fake NVML let their processes "hold the GPU" by opening files named
# like the device files in this directory (real kernels, real /proc, no GPU).
FAKE_DEVICES_ENV = "GPUNB_FAKE_NVIDIA_DEVICES"


def device_dir() -> str:
    return os.environ.get(FAKE_DEVICES_ENV) or "/dev"
MAX_FDS_SCANNED = 4096  # a process with more open files is not scanned further


@dataclass(frozen=True)
class ProcessFacts:
    """One process as seen from this PID namespace. ``exists`` False: no such PID here."""

    pid: int
    exists: bool
    name: str = ""
    username: str = ""  # "" when unknown
    uid: int | None = None
    ppid: int | None = None
    ancestors: tuple[int, ...] = ()  # parent, grandparent, ... (nearest first)
    create_time_unix: float | None = None
    script: str = ""  # python's script or module (``train.py``, ``-m torch.distributed.run``)
    kernel_id: str = ""  # from a ``kernel-<id>.json`` connection file on the command line
    is_jupyter_kernel: bool = False
    nvidia_files: tuple[str, ...] | None = None  # open /dev/nvidia* files; None: not readable

    @property
    def holds_nvidia_device(self) -> bool | None:
        return None if self.nvidia_files is None else bool(self.nvidia_files)

    @property
    def has_cuda_context(self) -> bool | None:
        if self.nvidia_files is None:
            return None
        return any(os.path.basename(f) == CUDA_DEVICE_NAME for f in self.nvidia_files)


def nvidia_files(pid: int, proc_root: str = "/proc") -> tuple[str, ...] | None:
    """The distinct ``/dev/nvidia*`` files ``pid`` holds open; None when its fds cannot be
    read (another user's process, or gone)."""
    prefix = os.path.join(device_dir(), "nvidia")
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    found: set[str] = set()
    for fd in fds[:MAX_FDS_SCANNED]:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(prefix):
            found.add(target)
    return tuple(sorted(found))


def _script(cmdline: list[str]) -> str:
    """What a python process runs, in a few words (never the full command line: arguments
    may carry tokens)."""
    if not cmdline:
        return ""
    if "python" not in os.path.basename(cmdline[0]):
        return ""
    args = cmdline[1:]
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return "-m " + args[i + 1]
        if arg == "-c":
            return "-c"
        if not arg.startswith("-"):
            return os.path.basename(arg)
    return ""


def kernel_id_of(cmdline: list[str]) -> str:
    for arg in cmdline:
        m = _KERNEL_FILE.search(arg)
        if m:
            return m.group(1)
    return ""


def _is_kernel(cmdline: list[str]) -> bool:
    text = " ".join(cmdline[:4])
    return "ipykernel" in text or "jupyter-kernel" in text or bool(kernel_id_of(cmdline))


def read_process_facts(pid: int, proc_root: str = "/proc") -> ProcessFacts:
    """Facts about ``pid`` that this user may read; never raises."""
    try:
        import psutil
    except ImportError:  # psutil is a dependency; still, a name is not worth a crash
        return ProcessFacts(pid, exists=os.path.exists(f"{proc_root}/{pid}"))
    try:
        p = psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        return ProcessFacts(pid, exists=False)
    except psutil.Error:
        return ProcessFacts(pid, exists=True)
    fields: dict[str, Any] = {}
    with p.oneshot():
        for key, read in (("name", p.name), ("ppid", p.ppid), ("create_time_unix", p.create_time),
                          ("username", p.username), ("cmdline", p.cmdline), ("uids", p.uids)):
            try:
                fields[key] = read()
            except psutil.NoSuchProcess:
                return ProcessFacts(pid, exists=False)
            except (psutil.Error, KeyError, OSError):  # AccessDenied, a uid with no passwd entry
                fields[key] = None
    try:
        ancestors = tuple(a.pid for a in p.parents())
    except psutil.Error:
        ancestors = (fields["ppid"],) if fields.get("ppid") else ()
    cmdline = fields.get("cmdline") or []
    uids = fields.get("uids")
    return ProcessFacts(
        pid=pid,
        exists=True,
        name=fields.get("name") or "",
        username=fields.get("username") or (str(uids.real) if uids else ""),
        uid=uids.real if uids else None,
        ppid=fields.get("ppid"),
        ancestors=ancestors,
        create_time_unix=fields.get("create_time_unix"),
        script=_script(cmdline),
        kernel_id=kernel_id_of(cmdline),
        is_jupyter_kernel=_is_kernel(cmdline),
        nvidia_files=nvidia_files(pid, proc_root),
    )


def descendants(pid: int) -> tuple[int, ...]:
    """Every child process of ``pid``, recursively (workers, spawned trainers)."""
    try:
        import psutil

        return tuple(c.pid for c in psutil.Process(pid).children(recursive=True))
    except Exception:  # gone, hidden, psutil missing: no children known
        return ()
