"""What one GPU did during a time window: NVML's utilization samples.

NVML keeps a ring of utilization samples stamped with the CPU clock in microseconds;
``nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)`` returns the
ones newer than ``last_seen_us``, so one call at the end of a cell covers the whole cell
without a polling thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpunb.readings.nvml import NvmlSession, Unavailable

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
    if isinstance(got, Unavailable):
        if got.code == 6:  # NVML_ERROR_NOT_FOUND: no sample newer than since_us (a very short cell)
            return UtilWindow(())
        return got
    _, samples = got
    ordered = sorted(samples, key=lambda s: s.timeStamp)
    return UtilWindow(tuple(_sample_value(s) for s in ordered if s.timeStamp > since_us))
