"""What one GPU did during a time window: NVML's utilization samples and who holds memory.

NVML keeps a ring of utilization samples stamped with the CPU clock in microseconds;
``nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)`` returns the
ones newer than ``last_seen_us``, so one call at the end of a cell covers the whole cell
without a polling thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from gpunb.readings.nvml import NvmlSession, Unavailable, is_available

GPU_UTILIZATION_SAMPLES = 1  # nvml.h nvmlSamplingType_t


def now_us() -> int:
    """A timestamp on NVML's sample clock (CPU wall clock, µs)."""
    return int(time.time() * 1e6)


@dataclass(frozen=True)
class UtilWindow:
    samples_pct: tuple[int, ...]  # GPU utilization samples inside the window, oldest first

    @property
    def mean_pct(self) -> float | None:
        return sum(self.samples_pct) / len(self.samples_pct) if self.samples_pct else None

    @property
    def idle_share(self) -> float | None:
        """Share of samples with no kernel running at all (utilization 0 %)."""
        return sum(1 for v in self.samples_pct if v == 0) / len(self.samples_pct) if self.samples_pct else None


def _sample_value(sample: Any) -> int:
    value = sample.sampleValue
    for field in ("uiVal", "ulVal", "ullVal"):
        v = getattr(value, field, None)
        if v is not None:
            return int(v)
    return int(value)


def read_util_since(nvml: NvmlSession, index: int, since_us: int) -> UtilWindow | Unavailable:
    got = nvml.device_query(index, "nvmlDeviceGetSamples", GPU_UTILIZATION_SAMPLES, since_us)
    if not is_available(got):
        if got.code == 6:  # NVML_ERROR_NOT_FOUND: no sample newer than since_us (a very short cell)
            return UtilWindow(())
        return got
    _, samples = got
    ordered = sorted(samples, key=lambda s: s.timeStamp)
    return UtilWindow(tuple(_sample_value(s) for s in ordered if s.timeStamp > since_us))


@dataclass(frozen=True)
class DeviceMemory:
    index: int
    name: Any
    total_bytes: Any
    used_bytes: Any  # all processes
    this_process_bytes: Any  # None: this PID is not in NVML's list (container PID namespace)
    other_processes_bytes: Any


def nvml_index_for_uuid(nvml: NvmlSession, uuid: str | None, fallback: int) -> int:
    """NVML's index of the GPU torch calls ``fallback``; matched by UUID when torch gives one,
    since NVML (PCI order) and CUDA (fastest first, CUDA_VISIBLE_DEVICES) may number differently."""
    if uuid:
        want = _norm_uuid(uuid)
        for i in range(nvml.device_count()):
            got = nvml.device_query(i, "nvmlDeviceGetUUID")
            if is_available(got) and _norm_uuid(str(got)) == want:
                return i
    return fallback


def _norm_uuid(uuid: str) -> str:
    """torch prints the bare UUID, NVML prefixes "GPU-"; compare without it."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def read_device_memory(nvml: NvmlSession, index: int, pid: int | None = None) -> DeviceMemory | Unavailable:
    mem = nvml.device_query(index, "nvmlDeviceGetMemoryInfo")
    if not is_available(mem):
        return mem
    pid = os.getpid() if pid is None else pid
    # PIDs and bytes only: read_processes also asks NVML for every process's name, one more
    # driver call per process that a cell's memory split does not need
    procs = nvml.device_query(index, "nvmlDeviceGetComputeRunningProcesses")
    mine: Any = None
    others: Any = procs
    if is_available(procs):
        used = [(p.pid, getattr(p, "usedGpuMemory", None) or 0) for p in procs]
        mine = sum(b for q, b in used if q == pid) if any(q == pid for q, _ in used) else None
        others = sum(b for q, b in used if q != pid)
    return DeviceMemory(index, nvml.device_query(index, "nvmlDeviceGetName"), mem.total, mem.used, mine, others)
