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

import functools
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


# Python's options that take a value (the next argument, or the rest of the same one): the value
# may be a secret (``-W ignore:SECRET``), never a script name.
_VALUE_OPTIONS = ("W", "X")
# Every single-letter option of CPython 3.10-3.14 that takes no value (``python --help``). A letter
# not here may take a value gpunb cannot tell apart from a script: then no script is named.
_FLAG_LETTERS = set("bBdEhiIOPqRsSuvVx?")


def _script(cmdline: list[str]) -> str:
    """What a python process runs, in a few words (never the full command line, and never an
    option's value: arguments may carry tokens)."""
    if not cmdline:
        return ""
    if "python" not in os.path.basename(cmdline[0]):
        return ""
    args = cmdline[1:]
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--check-hash-based-pycs":
            skip = True
            continue
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 1:
            letters = arg[1:]
            for j, letter in enumerate(letters):
                if letter in ("c", "m"):
                    rest = letters[j + 1:]
                    if letter == "c":
                        return "-c"
                    module = rest or (args[i + 1] if i + 1 < len(args) else "")
                    return "-m " + module if module else ""
                if letter in _VALUE_OPTIONS:
                    skip = not letters[j + 1:]  # "-W x": the value is the next argument
                    break
                if letter not in _FLAG_LETTERS:
                    return ""  # an option gpunb does not know: its value could be anything
            continue
        if arg.startswith("-"):
            continue
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


def read_ppid(pid: int, proc_root: str = "/proc") -> int | None:
    """The parent of ``pid`` from ``/proc/<pid>/stat`` (one small read; None when gone or hidden)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            data = f.read(4096)
        return int(data[data.rindex(b")") + 2:].split()[1])  # after the command name, which may hold ")"
    except (OSError, ValueError, IndexError):
        return None


class AncestorCache:
    """Parent chains of many processes, each parent read once: NVML's processes on a busy node
    (thousands, under MPS) share a handful of ancestors, and psutil's ``parents()`` would read
    each of them again for every process."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._ppid: dict[int, int | None] = {}

    def ppid(self, pid: int) -> int | None:
        if pid not in self._ppid:
            self._ppid[pid] = read_ppid(pid, self.proc_root)
        return self._ppid[pid]

    def ancestors(self, ppid: int | None) -> tuple[int, ...]:
        out: list[int] = []
        while ppid and ppid not in out and len(out) < 256:
            out.append(ppid)
            ppid = self.ppid(ppid)
        return tuple(out)


@functools.lru_cache(maxsize=4096)
def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):  # a uid with no passwd entry (containers)
        return str(uid)


@functools.lru_cache(maxsize=8)
def _has_proc(proc_root: str) -> bool:
    return hasattr(os, "sysconf") and os.path.isdir(f"{proc_root}/self")


@functools.lru_cache(maxsize=8)
def _boot_time(proc_root: str) -> float | None:
    try:
        with open(f"{proc_root}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str, limit: int = 1 << 16) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _from_proc(pid: int, proc_root: str, ancestors: AncestorCache) -> ProcessFacts:
    """:func:`read_process_facts` straight from ``/proc`` (Linux): three small reads and one
    ``stat`` per process, tens of µs, where psutil's objects cost milliseconds."""
    base = f"{proc_root}/{pid}"
    try:
        uid = os.stat(base).st_uid
    except FileNotFoundError:
        return ProcessFacts(pid, exists=False)
    except OSError:
        return ProcessFacts(pid, exists=True)
    stat_line = _read(f"{base}/stat", 4096)
    if not stat_line:
        return ProcessFacts(pid, exists=os.path.exists(base), uid=uid)
    try:
        close = stat_line.rindex(b")")
        name = stat_line[stat_line.index(b"(") + 1:close].decode(errors="replace")
        rest = stat_line[close + 2:].split()
        ppid, start_ticks = int(rest[1]), int(rest[19])
    except (ValueError, IndexError):
        return ProcessFacts(pid, exists=True, uid=uid)
    raw = _read(f"{base}/cmdline")
    cmdline = [a.decode(errors="replace") for a in raw.split(b"\0") if a] if raw else []
    if len(name) == 15 and cmdline and os.path.basename(cmdline[0]).startswith(name):
        name = os.path.basename(cmdline[0])  # the kernel keeps 15 characters of a name
    boot = _boot_time(proc_root)
    return ProcessFacts(
        pid=pid, exists=True, name=name, username=_user_name(uid), uid=uid, ppid=ppid,
        ancestors=ancestors.ancestors(ppid),
        create_time_unix=boot + start_ticks / _CLOCK_TICKS if boot is not None else None,
        script=_script(cmdline), kernel_id=kernel_id_of(cmdline), is_jupyter_kernel=_is_kernel(cmdline),
        nvidia_files=nvidia_files(pid, proc_root),
    )


def read_process_facts(pid: int, proc_root: str = "/proc", ancestors: AncestorCache | None = None) -> ProcessFacts:
    """Facts about ``pid`` that this user may read; never raises. ``ancestors``: a cache shared
    by the calls of one report; with it, and a ``/proc`` to read, the facts come from ``/proc``
    directly (a report over thousands of processes)."""
    if ancestors is not None and _has_proc(proc_root):
        return _from_proc(pid, proc_root, ancestors)
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
    if ancestors is not None:
        chain = ancestors.ancestors(fields.get("ppid"))
    else:
        try:
            chain = tuple(a.pid for a in p.parents())
        except psutil.Error:
            chain = (fields["ppid"],) if fields.get("ppid") else ()
    cmdline = fields.get("cmdline") or []
    uids = fields.get("uids")
    return ProcessFacts(
        pid=pid,
        exists=True,
        name=fields.get("name") or "",
        username=fields.get("username") or (str(uids.real) if uids else ""),
        uid=uids.real if uids else None,
        ppid=fields.get("ppid"),
        ancestors=chain,
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
