"""Which GPU is which, and which processes and memory on it belong to this kernel.

The one owner of two questions every feature asks (checks, sampler, profile, memory report,
OOM doctor, batch fit):

**Identity.** torch's ``cuda:N`` is the N-th device CUDA lets this process see, in the order
of ``CUDA_VISIBLE_DEVICES`` (``visible_devices.py``); NVML ignores that variable and numbers
every GPU of the machine by PCI bus. So under ``CUDA_VISIBLE_DEVICES=1,0`` torch's ``cuda:0``
is NVML's GPU 1. :func:`map_devices` builds the map from NVML's GPUs (index, UUID, MIG
instances) and the environment alone, without touching CUDA; where CUDA's fastest-first
numbering could differ from NVML's bus order (GPUs of different models without
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or MIG instances CUDA picks itself) the device is marked
uncertain. Once torch has initialized CUDA in this process, each device's UUID from torch
confirms the match (device properties are then safe to read; before, they would start CUDA
and poison fork-based launchers).

**Ownership.** NVML lists the processes on a GPU with their memory. This kernel owns its own
process and its descendants (DataLoader workers, ranks started from the notebook): a listed
PID is ours when it is this process (any of its PIDs in nested PID namespaces, ``NSpid`` in
proc(5)) or when its parent chain, as this PID namespace sees it, leads here. Inside a
container NVML reports host PIDs, which match nothing here; then, when torch holds memory on
the GPU, the one process no PID here names that holds torch's reserve plus at most a CUDA
context's worth is taken to be this one, and the record says so. Where NVML does not report
per-process memory (MIG, some drivers) the answer is unknown, never 0.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpunb.readings import torch_state
from gpunb.readings.gpu import GpuProcess, MigDevice, read_mig_devices, read_processes
from gpunb.readings.nvml import NvmlSession, Unavailable, is_available
from gpunb.readings.visible_devices import (
    BY_INDEX,
    BY_MIG_UUID,
    BY_ORDER,
    BY_UUID,
    BY_UUID_PREFIX,
    VisibleDevices,
    bus_order,
    mixed_models,
    resolve,
)

GiB = 2**30

# How a CUDA device was matched to NVML's GPU (``CudaDevice.matched_by``).
MATCH_TORCH_UUID = "UUID from torch"
MATCH_BY = {
    BY_ORDER: "enumeration order (CUDA_VISIBLE_DEVICES unset)",
    BY_INDEX: "CUDA_VISIBLE_DEVICES index",
    BY_UUID: "CUDA_VISIBLE_DEVICES UUID",
    BY_UUID_PREFIX: "CUDA_VISIBLE_DEVICES UUID prefix",
    BY_MIG_UUID: "CUDA_VISIBLE_DEVICES MIG UUID",
}

# How this kernel's processes were found on a GPU (``GpuOwnership.how``).
OWN_PID = "pid"
OWN_PID_AND_CHILDREN = "pid and child pid"
OWN_CHILD_PID = "child pid"
OWN_BY_RESERVE = "container: by torch's reserve"
OWN_NOT_LISTED = "not on this GPU"
OWN_UNKNOWN = "unknown"

# A CUDA context with cuBLAS/cuDNN/NCCL loaded stays well under this (about 0.5 GiB on the H200).
CONTEXT_SLACK_BYTES = 4 * GiB


def uuid_key(uuid: Any) -> str:
    """A UUID in one spelling: torch prints bare hex groups, NVML prefixes "GPU-" or "MIG-"."""
    text = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


# -- identity ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuIdentity:
    """What NVML says to tell one physical GPU apart (three queries, plus its MIG instances)."""

    index: int
    name: Any
    uuid: Any  # "GPU-..." or Unavailable (a lost GPU)
    mig_enabled: Any
    mig_devices: tuple[MigDevice, ...] = ()


def read_identities(nvml: NvmlSession) -> tuple[GpuIdentity, ...]:
    if not nvml.start().ok:
        return ()
    out = []
    for i in range(nvml.device_count()):
        mode = nvml.device_query(i, "nvmlDeviceGetMigMode")
        mig = bool(mode[0] if isinstance(mode, (tuple, list)) else mode) if is_available(mode) else mode
        out.append(GpuIdentity(i, nvml.device_query(i, "nvmlDeviceGetName"), nvml.device_query(i, "nvmlDeviceGetUUID"),
                               mig, read_mig_devices(nvml, i) if mig is True else ()))
    return tuple(out)


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device of this process and the physical GPU behind it."""

    cuda_index: int  # torch's cuda:N
    nvml_index: int | None  # NVML's index of the GPU (the parent GPU of a MIG instance); None: not found
    gpu_uuid: str | None
    mig_uuid: str | None  # the MIG instance CUDA uses; None on a whole GPU (or not known)
    visible_entry: str | None  # the CUDA_VISIBLE_DEVICES entry naming it; None when the variable is unset
    matched_by: str  # MATCH_TORCH_UUID or a MATCH_BY value
    certain: bool  # False where CUDA's numbering may differ from what the environment suggests


@dataclass(frozen=True)
class DeviceMap:
    """Every CUDA device of this process, with lookups both ways."""

    devices: tuple[CudaDevice, ...]
    visible: VisibleDevices
    gpu_count: int  # physical GPUs NVML sees
    uncertain: str = ""  # why some device's match may be wrong ("" when every match is certain)
    confirmed_by_torch: bool = False

    def device(self, cuda_index: int) -> CudaDevice | None:
        return self.devices[cuda_index] if 0 <= cuda_index < len(self.devices) else None

    def nvml_index(self, cuda_index: int) -> int | None:
        d = self.device(cuda_index)
        return d.nvml_index if d is not None else None

    def cuda_indices(self, nvml_index: int) -> tuple[int, ...]:
        """The CUDA devices on NVML's GPU ``nvml_index`` (several MIG instances may share one)."""
        return tuple(d.cuda_index for d in self.devices if d.nvml_index == nvml_index)

    def find(self, uuid: str) -> CudaDevice | None:
        """The device with this GPU or MIG UUID (any spelling)."""
        key = uuid_key(uuid)
        for d in self.devices:
            if key in (uuid_key(d.mig_uuid) if d.mig_uuid else None, uuid_key(d.gpu_uuid) if d.gpu_uuid else None):
                return d
        return None


def _by_uuid(gpus: Sequence[Any], uuid: str) -> tuple[int, str | None, str | None] | None:
    """(nvml index, GPU UUID, MIG UUID) of the GPU or MIG instance with this UUID."""
    key = uuid_key(uuid)
    for g in gpus:
        if isinstance(g.uuid, str) and uuid_key(g.uuid) == key:
            return g.index, g.uuid, None
        for mig in g.mig_devices:
            if mig.uuid and uuid_key(mig.uuid) == key:
                return g.index, g.uuid if isinstance(g.uuid, str) else None, mig.uuid
    return None


def map_devices(gpus: Sequence[Any], environ: Mapping[str, str],
                torch_uuids: Sequence[str | None] | None = None) -> DeviceMap:
    """The map from NVML's GPUs and the environment; ``torch_uuids`` (each ``cuda:N``'s UUID as
    torch reads it, given only once CUDA is initialized) confirms or corrects it. Pure."""
    vis = resolve(environ, gpus)
    by_index = {g.index: g for g in gpus}
    order_differs = len(gpus) > 1 and mixed_models(gpus) and not bus_order(environ)
    mig_picked = vis.raw is None and any(g.mig_enabled is True for g in gpus)
    guessed = []
    for i, (uuid, nvml_index) in enumerate(zip(vis.visible, vis.nvml_indices)):
        how = vis.how[i] if i < len(vis.how) else BY_ORDER
        gpu = by_index.get(nvml_index)
        gpu_uuid = gpu.uuid if gpu is not None and isinstance(gpu.uuid, str) else None
        by_order = how in (BY_INDEX, BY_ORDER) and order_differs  # a UUID names one GPU whatever the order
        guessed.append(CudaDevice(i, nvml_index, gpu_uuid, uuid if uuid.startswith("MIG-") else None,
                                  vis.entries[i] if i < len(vis.entries) else None, MATCH_BY[how],
                                  not (by_order or mig_picked)))
    reasons = []
    if mig_picked:
        reasons.append("MIG is enabled and CUDA_VISIBLE_DEVICES is unset, so CUDA picks the MIG instances itself")
    if order_differs and any(d.matched_by in (MATCH_BY[BY_INDEX], MATCH_BY[BY_ORDER]) for d in guessed):
        reasons.append("GPUs of different models without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers them "
                       "fastest-first, NVML by PCI bus")
    if torch_uuids is None:
        return DeviceMap(tuple(guessed), vis, len(gpus), "; ".join(reasons))
    confirmed = []
    for i, torch_uuid in enumerate(torch_uuids):
        entry = guessed[i].visible_entry if i < len(guessed) else None
        hit = _by_uuid(gpus, torch_uuid) if torch_uuid else None
        if hit is not None:
            confirmed.append(CudaDevice(i, hit[0], hit[1], hit[2], entry, MATCH_TORCH_UUID, True))
        elif i < len(guessed):  # NVML does not know torch's UUID (a lost GPU): keep the guess, unsure
            confirmed.append(replace(guessed[i], certain=False))
        else:
            confirmed.append(CudaDevice(i, None, None, None, entry, MATCH_TORCH_UUID, False))
    missing = [d.cuda_index for d in confirmed if not d.certain]
    note = (f"NVML lists no GPU with the UUID torch gives for {', '.join(f'cuda:{i}' for i in missing)}"
            if missing else "")
    return DeviceMap(tuple(confirmed), vis, len(gpus), note, confirmed_by_torch=True)


def torch_device_uuids(torch: Any) -> tuple[str | None, ...] | None:
    """Each CUDA device's UUID from torch, only when torch already initialized CUDA (else None,
    as when torch cannot count its devices)."""
    if not torch_state.cuda_initialized(torch):
        return None
    return tuple(torch_state.device_uuid(torch, i) for i in range(torch_state.device_count(torch))) or None


_cache_lock = threading.Lock()
_confirmed: weakref.WeakKeyDictionary[NvmlSession, tuple[int, DeviceMap]] = weakref.WeakKeyDictionary()


def read_device_map(nvml: NvmlSession, environ: Mapping[str, str] | None = None, torch: Any = None) -> DeviceMap:
    """The device map now. ``torch`` defaults to the kernel's (if the user imported it); a map
    confirmed by torch is kept for the session, since CUDA's devices cannot change once
    initialized. Before that it is rebuilt each call (three NVML queries a GPU): the
    environment may still change."""
    torch = torch if torch is not None else torch_state.imported_torch()
    if torch_state.cuda_initialized(torch):
        with _cache_lock:
            kept = _confirmed.get(nvml)
        if kept is not None and kept[0] == id(torch):
            return kept[1]
        found = map_devices(read_identities(nvml), os.environ if environ is None else environ,
                            torch_device_uuids(torch))
        if found.confirmed_by_torch and found.devices and not found.uncertain:  # else asked again next time
            with _cache_lock:
                _confirmed[nvml] = (id(torch), found)
        return found
    return map_devices(read_identities(nvml), os.environ if environ is None else environ)


# -- ownership --------------------------------------------------------------------------------

def namespace_pids(pid: int) -> frozenset[int]:
    """``pid`` and its numbers in the other PID namespaces it belongs to (``NSpid`` in
    /proc/<pid>/status, Linux >= 4.1): NVML may report any of them."""
    found = {pid}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    found.update(int(x) for x in line.split()[1:])
                    break
    except (OSError, ValueError):
        pass
    return frozenset(found)


class ProcessTable:
    """Processes as this PID namespace sees them (psutil, /proc); a fake one is passed in tests."""

    def ancestors(self, pid: int) -> tuple[int, ...] | None:
        """``pid``'s parent chain, nearest first; None when no process ``pid`` is visible here
        (inside a container NVML's host PIDs mostly are not)."""
        import psutil

        try:
            return tuple(p.pid for p in psutil.Process(pid).parents())
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return None

    def descendants(self, pids: Iterable[int]) -> set[int]:
        """Every process below ``pids`` (one walk of the process table)."""
        import psutil

        out: set[int] = set()
        for pid in pids:
            try:
                out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                continue
        return out

    def holds_gpu(self, pid: int) -> bool | None:
        """Whether ``pid`` has an NVIDIA device file open (every CUDA process does); None when
        its files cannot be read. A local process without one is not the process NVML means:
        its number is a host PID that happens to exist here too (process_facts.py)."""
        from gpunb.readings.process_facts import nvidia_files

        files = nvidia_files(pid)
        return None if files is None else bool(files)


@dataclass(frozen=True)
class GpuOwnership:
    """This kernel's share of one GPU: its own process, its child processes, everyone else."""

    nvml_index: int
    how: str  # OWN_* : how this kernel's processes were found
    self_bytes: int | None  # this process; None: unknown (see ``note``)
    children_bytes: int | None  # its descendants (0 when none is on this GPU)
    processes: tuple[GpuProcess, ...] = ()  # this kernel's processes NVML lists (this one first)
    others: tuple[GpuProcess, ...] = ()  # every other process NVML lists
    note: str = ""  # why something is unknown, or what the match could not see

    @property
    def own_bytes(self) -> int | None:
        """This kernel's memory on the GPU (itself and its children); None when unknown."""
        if self.self_bytes is None or self.children_bytes is None:
            return None
        return self.self_bytes + self.children_bytes

    @property
    def others_bytes(self) -> int | None:
        """Every other process's memory; None when NVML does not say for some of them."""
        used = [p.used_bytes for p in self.others]
        return sum(used) if all(isinstance(b, int) for b in used) else None

    def to_dict(self) -> dict[str, Any]:
        return {"nvml_index": self.nvml_index, "how": self.how, "self_bytes": self.self_bytes,
                "children_bytes": self.children_bytes, "own_bytes": self.own_bytes,
                "others_bytes": self.others_bytes, "note": self.note,
                "processes": [p.__dict__ for p in self.processes], "others": [p.__dict__ for p in self.others]}


def _sum_known(procs: Iterable[GpuProcess]) -> int | None:
    used = [p.used_bytes for p in procs]
    return sum(used) if all(isinstance(b, int) for b in used) else None


def match_by_reserve(candidates: Sequence[Any], torch_reserved: int) -> Any | None:
    """The one candidate (anything with ``used_bytes``) holding torch's reserve plus at most a
    CUDA context's worth, or None when none or several do (then nothing is claimed)."""
    fits = [p for p in candidates if isinstance(getattr(p, "used_bytes", None), int)
            and 0 <= p.used_bytes - torch_reserved <= CONTEXT_SLACK_BYTES]
    return fits[0] if len(fits) == 1 else None


def attribute_processes(nvml_index: int, procs: Sequence[GpuProcess] | Unavailable, self_pids: Iterable[int],
                        torch_reserved: int | None, table: Any = None) -> GpuOwnership:
    """Split NVML's process list of one GPU into this kernel's and everyone else's. Pure but
    for ``table`` (this namespace's processes).

    ``self_pids``: this process's PIDs (all namespaces). ``torch_reserved``: what torch's
    allocator holds on this GPU in this process, None when torch has no CUDA memory here."""
    if isinstance(procs, Unavailable):
        return GpuOwnership(nvml_index, OWN_UNKNOWN, None, None,
                            note=f"NVML cannot list the GPU's processes: {procs.reason}")
    table = table if table is not None else ProcessTable()
    mine = set(self_pids)
    own: list[GpuProcess] = []
    children: list[GpuProcess] = []
    rest: list[GpuProcess] = []
    # This kernel's descendants found once (one walk of the process table), not each listed
    # process's parents: with 60,000 processes listed that walk per process took minutes.
    find_descendants = getattr(table, "descendants", None)
    descendants = find_descendants(mine) if find_descendants is not None else None
    chains: dict[int, tuple[int, ...] | None] = {}

    def chain_of(pid: int) -> tuple[int, ...] | None:
        if pid not in chains:
            chains[pid] = table.ancestors(pid)
        return chains[pid]

    for p in procs:
        if p.pid in mine:
            own.append(p)
        elif descendants is not None:
            (children if p.pid in descendants else rest).append(p)
        else:
            chain = chain_of(p.pid)
            (children if chain is not None and mine.intersection(chain) else rest).append(p)
    hidden_found: list[list[GpuProcess]] = []

    def split_hidden() -> list[GpuProcess]:
        """The processes not visible here, or visible under another number (a host PID):
        looked at only when this kernel's own PID is not listed (each PID once)."""
        if not hidden_found:
            gpu_held: dict[int, bool | None] = {}
            hidden = []
            for p in rest:
                if chain_of(p.pid) is None:
                    hidden.append(p)
                    continue
                if p.pid not in gpu_held:
                    gpu_held[p.pid] = table.holds_gpu(p.pid)
                if gpu_held[p.pid] is False:  # the same number, another process: NVML means a host PID
                    hidden.append(p)
            hidden_found.append(hidden)
        return hidden_found[0]

    note = ""
    if own:
        how = OWN_PID_AND_CHILDREN if children else OWN_PID
    elif torch_reserved:  # torch holds memory here, yet NVML lists no PID of ours: another PID namespace
        me = match_by_reserve(split_hidden(), torch_reserved)
        if me is not None:
            own.append(me)
            rest.remove(me)
            how = OWN_BY_RESERVE
            note = (f"NVML lists this process as PID {me.pid} (a container's PID namespace): matched by torch's "
                    "reserve; child processes cannot be told apart from other processes here")
        else:
            how = OWN_UNKNOWN
            note = ("NVML does not list this process's PID (a container's PID namespace?) and no single process "
                    "it lists holds torch's reserve plus a CUDA context")
    elif torch_reserved == 0 and split_hidden():
        how = OWN_UNKNOWN
        note = ("torch has CUDA up but nothing reserved on this GPU, and NVML lists PIDs not visible here "
                "(a container's PID namespace?): this process's CUDA context may be one of them")
    else:
        how = OWN_CHILD_PID if children else OWN_NOT_LISTED
    others = rest
    self_bytes = None if how == OWN_UNKNOWN else (_sum_known(own) if own else 0)
    children_bytes = _sum_known(children)
    if (own or children) and (self_bytes is None or children_bytes is None) and not note:
        note = "NVML does not report per-process memory here (MIG or this driver)"
    return GpuOwnership(nvml_index, how, self_bytes, children_bytes, tuple(own + children), tuple(others), note)


def kernel_pids(pid: int | None = None) -> frozenset[int]:
    """This process's PIDs in every PID namespace it belongs to."""
    return namespace_pids(os.getpid() if pid is None else pid)


def torch_reserved_on(torch: Any, device_map: DeviceMap, nvml_index: int) -> int | None:
    """What torch's allocator holds on NVML's GPU ``nvml_index`` in this process (summed over
    MIG instances on it); None when torch has no CUDA up or uses no device on that GPU."""
    if not torch_state.cuda_initialized(torch):
        return None
    devices = device_map.cuda_indices(nvml_index)
    if not devices:
        return None
    held = [torch_state.reserved_bytes(torch, d) for d in devices]
    known = [b for b in held if b is not None]
    return sum(known) if len(known) == len(held) else None


def read_ownership(nvml: NvmlSession, nvml_index: int, *, torch: Any = None, device_map: DeviceMap | None = None,
                   pids: Iterable[int] | None = None, names: bool = True, table: Any = None) -> GpuOwnership:
    """This kernel's share of NVML's GPU ``nvml_index`` now.

    ``torch`` defaults to the kernel's (read only if imported and CUDA is up); ``pids`` to this
    process's; ``names=False`` skips the process-name queries (a driver call per process)."""
    torch = torch if torch is not None else torch_state.imported_torch()
    reserved = None
    if torch_state.cuda_initialized(torch):
        device_map = device_map if device_map is not None else read_device_map(nvml, torch=torch)
        reserved = torch_reserved_on(torch, device_map, nvml_index)
    own = frozenset(pids) if pids is not None else kernel_pids()
    return attribute_processes(nvml_index, read_processes(nvml, nvml_index, names=names), own, reserved, table)
