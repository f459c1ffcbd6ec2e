"""What a profiled cell reads from NVML, on the NVML worker: the GPU's used memory while the cell
runs (for the memory timeline) and, at its end, in one trip, the GPU count and name, the driver's
CUDA version, this kernel's share of its GPU and the utilization samples since the cell began.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from gpunb.readings import torch_state
from gpunb.readings.devices import GpuOwnership, read_device_map, read_ownership
from gpunb.readings.gpu import read_driver
from gpunb.readings.gpu_activity import UtilWindow, read_util_since
from gpunb.readings.nvml import NvmlSession, PendingRun, Unavailable, is_available


class DeviceUsedReader:
    """NVML's used bytes on the cell's GPU for the memory timeline, read by the NVML worker
    while the cell goes on: each call returns the newest reading that came back (None while
    none has) and asks for the next, one at a time. Waiting for each reading cost the step
    that took a timeline point a trip to the worker and back."""

    def __init__(self, nvml: NvmlSession, index: int) -> None:
        self.nvml, self.index = nvml, index
        self.pending: PendingRun[int | None] | None = None

    def __call__(self) -> int | None:
        got = None
        pending = self.pending
        if pending is not None and pending.ready():
            got = pending.result()
            pending = None
        if pending is None:
            pending = self.nvml.run_soon(_read_used, self.nvml, self.index, fallback=_no_reading,
                                         budget_s=self.nvml.call_timeout_s, what="the GPU's used memory")
        self.pending = pending
        return got

    def last(self) -> int | None:
        """The reading still on its way (at the cell's end), waited for."""
        pending, self.pending = self.pending, None
        return pending.result() if pending is not None else None


def _read_used(nvml: NvmlSession, index: int) -> int | None:
    mem = nvml.device_query(index, "nvmlDeviceGetMemoryInfo")
    return int(mem.used) if is_available(mem) else None


def _no_reading(why: str) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class NvmlEnd:
    """What NVML says at a cell's end: the GPU count, the first GPU's name, the driver's CUDA
    version and, for the device this kernel uses (``device``: torch's index), its NVML index,
    this kernel's share of it and the utilization samples since the cell began."""

    count: int
    name: Any = None
    driver_cuda: Any = None
    device: int | None = None
    index: int | None = None
    own: GpuOwnership | None = None
    util: UtilWindow | Unavailable | None = None


def device_now(torch: Any, cuda: bool) -> int | None:
    """torch's current device in the calling thread (CUDA's current device is per thread)."""
    if not cuda:
        return None
    try:
        return torch_state.current_device(torch)
    except Exception:  # a broken CUDA context: the torch side of the report says so
        return None


_named_gpus: weakref.WeakKeyDictionary[NvmlSession, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def read_nvml_end(nvml: NvmlSession, torch: Any, dev: int | None, since_us: int) -> NvmlEnd:
    """On the NVML worker (one trip for all of them); ``torch`` and ``dev``: the kernel's torch
    and its current device when CUDA is up (read in the kernel's thread), else None."""
    count = nvml.device_count()
    if not count:
        return NvmlEnd(0)
    known = _named_gpus.get(nvml)
    if known is None:
        known = (nvml.device_query(0, "nvmlDeviceGetName"), read_driver(nvml).cuda_driver_version)
        if all(is_available(v) for v in known):  # a driver's name and version do not change under a process
            _named_gpus[nvml] = known
    name, driver_cuda = known
    if torch is None or dev is None:
        return NvmlEnd(count, name, driver_cuda)
    index = read_device_map(nvml, torch=torch).nvml_index(dev)
    if index is None:
        return NvmlEnd(count, name, driver_cuda, dev)
    # PIDs and bytes only: the process names would cost one more driver call per process
    own = read_ownership(nvml, index, torch=torch, names=False)
    return NvmlEnd(count, name, driver_cuda, dev, index, own, read_util_since(nvml, index, since_us))


def unread_nvml_end(why: str) -> NvmlEnd:
    return NvmlEnd(0)
