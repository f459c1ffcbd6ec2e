"""Who holds each GPU: NVML's processes joined with a Jupyter server's kernels and notebooks.

NVML knows PIDs and bytes. The server knows its kernels (PID, state, last activity) and the
notebook or console of each. Process facts (psutil, ``/proc``) connect the two: a PID that
is a kernel, a child of a kernel (DataLoader workers, spawned trainers), a Jupyter kernel
this server does not own (another server's, or one left behind when an earlier server
died), another program, or a PID this PID namespace cannot see (NVML reports host PIDs
inside a container without ``--pid=host``; then nothing can be mapped, and the report says
so instead of guessing).

The same records travel as JSON to the notebook kernels (``/gpunb/api/gpus``), where the
monitor and the OOM doctor turn them into words with :func:`describe`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpunb.analysis.machine import without_gpu
from gpunb.readings.energy import read_energy
from gpunb.readings.gpu import GpuInfo, clock_event_names, read_info, read_processes, read_sample
from gpunb.readings.nvml import NvmlSession, Unavailable, is_available
from gpunb.readings.process_facts import AncestorCache, ProcessFacts, descendants, read_process_facts
from gpunb.readings.server_kernels import KernelInfo
from gpunb.readings.test_hooks import active_fakes
from gpunb.units import gib

# Holder kinds (stable: the JSON API, metrics labels and tests key on them).
KERNEL = "kernel"  # a kernel of this server
KERNEL_CHILD = "kernel-child"  # a process started by one of this server's kernels
OTHER_KERNEL = "other-kernel"  # a Jupyter kernel this server does not run
PROCESS = "process"  # any other process this namespace can see (a script, another user's job)
NOT_VISIBLE = "not-visible"  # no such PID here (another PID namespace, or hidden by hidepid)
PID_MISMATCH = "pid-namespace"  # the PID exists here but is another process (no NVIDIA device open)
KINDS = (KERNEL, KERNEL_CHILD, OTHER_KERNEL, PROCESS, NOT_VISIBLE, PID_MISMATCH)
UNMAPPABLE = (NOT_VISIBLE, PID_MISMATCH)

NAMESPACE_NOTE = (
    "NVML reports GPU processes by PIDs that are not processes of this server's PID namespace, "
    "so they cannot be matched to kernels (typical inside a container: NVML gives host PIDs). "
    "Fix: run the container in the host's PID namespace (`docker run --pid=host`, Kubernetes "
    "`hostPID: true`); meanwhile each notebook's own `%gpumem` shows what it holds."
)


@dataclass(frozen=True)
class GpuHolder:
    """One process holding memory on one GPU, with everything known about whose it is."""

    gpu_index: int
    pid: int
    used_bytes: int | None  # None where NVML does not say (MIG, some drivers)
    kind: str
    kernel_id: str = ""
    kernel_pid: int | None = None  # the kernel a child process belongs to
    path: str = ""  # notebook/console path of the kernel (relative to the server's root)
    session_type: str = ""
    execution_state: str = ""
    last_activity_unix: float | None = None
    process_name: str = ""
    username: str = ""
    script: str = ""
    note: str = ""  # why it could not be mapped, or what else is known
    # On the kernel's first row per GPU (kernel_energy.py): its share of the GPU's energy while
    # it held the GPU, and of the current idle stretch (joules, seconds measured)
    energy_j: float | None = None
    idle_energy_j: float | None = None
    idle_measured_s: float | None = None
    # the energy above is a share of a GPU others also use: with whom it was split (their
    # processes, other users' included, move it); '' when the kernel had the GPU to itself
    energy_shared_with: str = ""

    def to_dict(self) -> dict[str, Any]:
        # every field is a str, a number or None: no deep copy (asdict) needed, thousands per report
        return {name: getattr(self, name) for name in _HOLDER_FIELDS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuHolder:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


_HOLDER_FIELDS = tuple(f.name for f in fields(GpuHolder))


@dataclass(frozen=True)
class DeviceState:
    """One GPU now: identity, the moving readings, and who holds its memory."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    util_gpu_pct: float | None
    util_memory_pct: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    clock_event_reasons: int | None
    lost: bool
    holders: tuple[GpuHolder, ...] = ()
    holders_unavailable: str = ""  # why NVML gave no process list
    unavailable: dict[str, str] = field(default_factory=dict)  # reading -> reason
    energy_mj: int | None = None  # NVML's energy counter: millijoules since the driver loaded

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "holders"}
        d["clock_event_names"] = clock_event_names(self.clock_event_reasons or 0)
        d["processes"] = [h.to_dict() for h in self.holders]
        return d


@dataclass(frozen=True)
class KernelUse:
    """A kernel of this server and the GPU memory it holds (itself and its children)."""

    kernel: KernelInfo
    gpu_bytes: dict[int, int]  # GPU index -> bytes (only processes whose memory NVML gives)
    gpu_pids: tuple[int, ...]
    has_cuda_context: bool | None  # /dev/nvidia-uvm open by it or a child; None: unreadable

    @property
    def total_gpu_bytes(self) -> int:
        return sum(self.gpu_bytes.values())

    def to_dict(self, now_unix: float) -> dict[str, Any]:
        k = self.kernel
        return {
            "kernel_id": k.kernel_id,
            "kernel_name": k.spec_name,
            "pid": k.pid,
            "execution_state": k.execution_state,
            "last_activity_unix": k.last_activity_unix,
            "idle_s": idle_seconds(k.execution_state, k.last_activity_unix, now_unix),
            "connections": k.connections,
            "sessions": [asdict(s) for s in k.sessions],
            "path": k.path,
            "gpu_memory_bytes": {str(i): b for i, b in sorted(self.gpu_bytes.items())},
            "gpu_memory_total_bytes": self.total_gpu_bytes,
            "gpu_pids": list(self.gpu_pids),
            "has_cuda_context": self.has_cuda_context,
        }


@dataclass(frozen=True)
class HoldersReport:
    """Every GPU and every kernel of one Jupyter server, at ``t_unix``."""

    t_unix: float
    nvml_ok: bool
    nvml_cause: str = ""
    nvml_fix: str = ""
    driver_version: str = ""
    devices: tuple[DeviceState, ...] = ()
    kernels: tuple[KernelUse, ...] = ()
    notes: tuple[str, ...] = ()
    fake: tuple[str, ...] = ()  # test stand-ins answering instead of the driver (readings/test_hooks.py)

    def holders(self) -> list[GpuHolder]:
        return [h for d in self.devices for h in d.holders]

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_unix": self.t_unix,
            "nvml": {"ok": self.nvml_ok, "cause": self.nvml_cause, "fix": self.nvml_fix},
            "driver_version": self.driver_version,
            "gpus": [d.to_dict() for d in self.devices],
            "kernels": [k.to_dict(self.t_unix) for k in self.kernels],
            "notes": list(self.notes),
            "fake": bool(self.fake),  # true: a recording from gpunb's test stand-ins, not this machine
            "fake_sources": list(self.fake),
        }


# -- joining --------------------------------------------------------------------------------

def classify(pid: int, gpu_index: int, used_bytes: int | None, kernels: Iterable[KernelInfo],
             facts_of: Callable[[int], ProcessFacts]) -> GpuHolder:
    """Whose is GPU process ``pid``? Never guesses: a PID that is not verifiably the process
    NVML means stays unmapped, with the reason."""
    by_pid = {k.pid: k for k in kernels if k.pid}
    f = facts_of(pid)
    base: dict[str, Any] = dict(gpu_index=gpu_index, pid=pid, used_bytes=used_bytes)
    if not f.exists:
        return GpuHolder(kind=NOT_VISIBLE, **base, note=(
            "no process with this PID is visible here: it runs in another PID namespace (NVML reports "
            "host PIDs inside a container) or /proc hides other users' processes (hidepid)"))
    who: dict[str, Any] = dict(process_name=f.name, username=f.username, script=f.script)
    if f.holds_nvidia_device is False:
        return GpuHolder(kind=PID_MISMATCH, **base, **who, note=(
            f"PID {pid} here is {f.name or 'a process'} without any NVIDIA device open, so it is not the "
            "process NVML means: NVML's PIDs come from another PID namespace"))
    owner = by_pid.get(pid)
    if owner is None:
        owner = next((by_pid[a] for a in f.ancestors if a in by_pid), None)
    if owner is not None:
        return GpuHolder(
            kind=KERNEL if owner.pid == pid else KERNEL_CHILD, **base, **who,
            kernel_id=owner.kernel_id, kernel_pid=owner.pid, path=owner.path,
            session_type=owner.sessions[0].type if owner.sessions else "",
            execution_state=owner.execution_state, last_activity_unix=owner.last_activity_unix,
        )
    if f.is_jupyter_kernel:
        mine = f.uid is not None and f.uid == getattr(os, "getuid", lambda: None)()
        return GpuHolder(kind=OTHER_KERNEL, **base, **who, kernel_id=f.kernel_id if mine else "",
                         note=_kernel_parent(f, facts_of))
    return GpuHolder(kind=PROCESS, **base, **who)


def _kernel_parent(f: ProcessFacts, facts_of: Callable[[int], ProcessFacts]) -> str:
    """Whose a kernel that this server does not run is, as far as its parent tells."""
    parent = facts_of(f.ppid) if f.ppid and f.ppid > 1 else None
    if parent is None or not parent.exists:
        return "left behind: its parent process is gone (a kernel of an earlier server)"
    what = f"{parent.name} {parent.script}".strip()
    if "jupyter" in what.lower() or "notebook" in what.lower():
        return f"of another Jupyter server (parent PID {parent.pid} {what})"
    return f"started by PID {parent.pid} {what}".rstrip()


def _num(value: Any) -> Any:
    return value if is_available(value) else None


def _device(info: GpuInfo, sample: Any, holders: tuple[GpuHolder, ...], procs_reason: str,
            energy_mj: Any = None) -> DeviceState:
    readings = {
        "memory_total_bytes": sample.memory_total_bytes, "memory_used_bytes": sample.memory_used_bytes,
        "memory_free_bytes": sample.memory_free_bytes, "util_gpu_pct": sample.util_gpu_pct,
        "util_memory_pct": sample.util_memory_pct, "power_w": sample.power_w, "power_limit_w": info.power_limit_w,
        "temp_c": sample.temp_c, "sm_clock_mhz": sample.sm_clock_mhz,
        "clock_event_reasons": sample.clock_event_reasons,
    }
    return DeviceState(
        index=info.index,
        uuid=info.uuid if is_available(info.uuid) else "",
        name=info.name if is_available(info.name) else "",
        pci_bus_id=info.pci_bus_id if is_available(info.pci_bus_id) else "",
        lost=bool(info.lost or sample.lost),
        holders=holders,
        holders_unavailable=procs_reason,
        unavailable={k: v.reason for k, v in readings.items() if isinstance(v, Unavailable)},
        energy_mj=energy_mj if isinstance(energy_mj, int) and not isinstance(energy_mj, bool) else None,
        **{k: _num(v) for k, v in readings.items()},
    )


def build_report(
    nvml: NvmlSession,
    kernels: Iterable[KernelInfo],
    *,
    infos: tuple[GpuInfo, ...] | None = None,
    facts_of: Callable[[int], ProcessFacts] | None = None,
    children_of: Callable[[int], tuple[int, ...]] = descendants,
    now: Callable[[], float] = time.time,
) -> HoldersReport:
    """Read NVML and the process table now and join them with ``kernels``. Blocking (NVML,
    /proc): run it off an event loop. ``infos`` (static GPU facts) may be passed cached.
    Built for busy nodes (3,000 GPU processes under MPS in well under 1 s): NVML's process names
    are not asked for (``/proc`` names them), and parent chains are read once per report."""
    kernels = tuple(kernels)
    if facts_of is None:
        chains = AncestorCache()
        facts_of = lambda pid: read_process_facts(pid, ancestors=chains)  # noqa: E731
    status = nvml.start()
    t = now()
    cache: dict[int, ProcessFacts] = {}

    def facts(pid: int) -> ProcessFacts:
        if pid not in cache:
            cache[pid] = facts_of(pid)
        return cache[pid]

    devices: list[DeviceState] = []
    driver = ""
    if status.ok:
        version = nvml.query("nvmlSystemGetDriverVersion")
        driver = version if is_available(version) else ""
        if infos is None:
            infos = tuple(read_info(nvml, i) for i in range(nvml.device_count()))
        for info in infos:
            sample = read_sample(nvml, info.index)
            energy = read_energy(nvml, info.index).energy_mj
            procs = read_processes(nvml, info.index, names=False)
            if not isinstance(procs, Unavailable):
                holders = tuple(classify(p.pid, info.index, p.used_bytes if isinstance(p.used_bytes, int) else None,
                                         kernels, facts) for p in procs)
                devices.append(_device(info, sample, holders, "", energy))
            else:
                devices.append(_device(info, sample, (), procs.reason, energy))
    all_holders = [h for d in devices for h in d.holders]
    uses = []
    for k in kernels:
        mine = [h for h in all_holders if h.kernel_id == k.kernel_id and h.kind in (KERNEL, KERNEL_CHILD)]
        per_gpu: dict[int, int] = {}
        for h in mine:
            if h.used_bytes is not None:
                per_gpu[h.gpu_index] = per_gpu.get(h.gpu_index, 0) + h.used_bytes
        uses.append(KernelUse(k, per_gpu, tuple(sorted({h.pid for h in mine})), _cuda_context(k, facts, children_of)))
    notes = []
    if any(h.kind in UNMAPPABLE for h in all_holders):
        notes.append(NAMESPACE_NOTE)
    if not status.ok:
        notes.append(without_gpu(status))
    return HoldersReport(t, status.ok, status.cause, status.fix, driver, tuple(devices), tuple(uses), tuple(notes),
                         active_fakes(nvml_fake=nvml.fake))


def _cuda_context(kernel: KernelInfo, facts: Callable[[int], ProcessFacts],
                  children_of: Callable[[int], tuple[int, ...]]) -> bool | None:
    """Whether the kernel or one of its children has a CUDA context (device files: works
    where NVML's PIDs cannot be mapped)."""
    if kernel.pid is None:
        return None
    own = facts(kernel.pid).has_cuda_context
    if own:
        return True
    for child in children_of(kernel.pid):
        if facts(child).has_cuda_context:
            return True
    return own


# -- words ----------------------------------------------------------------------------------

def idle_seconds(state: str, last_activity_unix: float | None, now_unix: float) -> float | None:
    if state != "idle" or last_activity_unix is None:
        return None
    return max(0.0, now_unix - last_activity_unix)


def duration_words(seconds: float) -> str:
    """40 s, 12 min, 3 h 5 min, 2 d 4 h."""
    s = int(seconds)
    if s < 90:
        return f"{s} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} d {h} h" if h else f"{d} d"


def state_words(state: str, last_activity_unix: float | None, now_unix: float) -> str:
    idle = idle_seconds(state, last_activity_unix, now_unix)
    if idle is not None:
        return f"idle {duration_words(idle)}"
    return state or "state unknown"


def describe(h: GpuHolder, now_unix: float, this_kernel_id: str = "") -> str:
    """Who ``h`` is, in a few words: ``lesson3.ipynb (idle 40 min)``, ``this notebook``,
    ``PID 4242 python3 train.py (user bob)``."""
    if h.kind in (KERNEL, KERNEL_CHILD):
        if this_kernel_id and h.kernel_id == this_kernel_id:
            who = "this notebook"
        else:
            who = h.path or f"kernel {h.kernel_id[:8]} (no notebook attached)"
            who += f" ({state_words(h.execution_state, h.last_activity_unix, now_unix)})"
        if h.kind == KERNEL_CHILD:
            who += f", its child PID {h.pid} {h.process_name}".rstrip()
        return who
    user = f", user {h.username}" if h.username else ""
    if h.kind == OTHER_KERNEL:
        return f"PID {h.pid} Jupyter kernel {h.note}{user}"
    if h.kind == PROCESS:
        what = " ".join(x for x in (h.process_name, h.script) if x)
        return f"PID {h.pid} {what}{' (' + user[2:] + ')' if user else ''}".rstrip()
    # NVML reports PIDs as the host sees them; inside a container that PID is another process or none
    return f"PID {h.pid}, a process outside this container (its name cannot be read from here)"


def holder_line(h: GpuHolder, now_unix: float, this_kernel_id: str = "") -> str:
    """``lesson3.ipynb (idle 40 min) holds 31.0 GiB``."""
    held = gib(h.used_bytes) if h.used_bytes is not None else "an unknown amount"
    return f"{describe(h, now_unix, this_kernel_id)} holds {held}"
