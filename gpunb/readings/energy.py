"""What a GPU spent and moved, from NVML: its energy counter, its power samples and PCIe traffic.

- ``nvmlDeviceGetTotalEnergyConsumption``: millijoules since the driver loaded (Volta and
  later). Measured on an H200 (2026-12-01, ``scripts/record_energy_links.py``): it changes
  about 10 times a second, so an energy is a window's difference of two readings, never
  one short step's own reading.
- ``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)``: the driver's ring of power readings
  (mW, stamped in CPU µs), the fallback where the counter is missing. Each is a ~1 s
  average, so integrating them is an estimate: over a 3 s bf16 matmul burst on the H200
  the integral read 1,635 J where the counter read 1,942 J (−16 %).
- ``nvmlDeviceGetPcieThroughput``: KB/s over NVML's last short window, per direction. On the
  H200 a pinned host→device copy loop read 58.9 GB/s RX. NVML's PCIe byte-count fields
  (197/198) are 32-bit and wrap every ~80 ms at that rate, so they are not used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpunb.readings.gpu_activity import now_us
from gpunb.readings.nvml import NvmlSession, Unavailable, is_available

TOTAL_POWER_SAMPLES = 0  # nvml.h nvmlSamplingType_t NVML_TOTAL_POWER_SAMPLES
PCIE_TX_BYTES = 0  # nvml.h nvmlPcieUtilCounter_t: GPU -> host
PCIE_RX_BYTES = 1  # host -> GPU
KB = 1000  # NVML's "KB/s" (the H200's copy loop matched 1000, not 1024)


@dataclass(frozen=True)
class EnergyReading:
    """One GPU's energy counter at ``t_s`` (monotonic clock) and ``t_us`` (NVML's sample clock)."""

    index: int
    t_s: float
    t_us: int
    energy_mj: Any  # int, or Unavailable where the GPU has no counter


@dataclass(frozen=True)
class PowerSamples:
    """NVML's power readings of a window: (CPU µs, W), oldest first."""

    points: tuple[tuple[int, float], ...]

    def joules(self, start_us: int, end_us: int) -> float | None:
        """The power readings integrated over [start_us, end_us], each held until the next
        (an estimate; None with no reading inside the window)."""
        inside = [(t, w) for t, w in self.points if start_us < t <= end_us]
        if not inside:
            return None
        earlier = [w for t, w in self.points if t <= start_us]
        level = earlier[-1] if earlier else inside[0][1]  # the reading in force at the start
        total, since = 0.0, start_us
        for t, w in inside:
            total += level * (t - since)
            since, level = t, w
        total += level * (end_us - since)
        return total / 1e6


@dataclass(frozen=True)
class PcieReading:
    index: int
    t_s: float
    tx_bytes_s: Any  # GPU -> host, bytes/s (or Unavailable)
    rx_bytes_s: Any  # host -> GPU


def read_energy(nvml: NvmlSession, index: int, clock: Callable[[], float] = time.monotonic) -> EnergyReading:
    value = nvml.device_query(index, "nvmlDeviceGetTotalEnergyConsumption")
    return EnergyReading(index, clock(), now_us(), value)


def read_power_since(nvml: NvmlSession, index: int, since_us: int) -> PowerSamples | Unavailable:
    got = nvml.device_query(index, "nvmlDeviceGetSamples", TOTAL_POWER_SAMPLES, since_us)
    if isinstance(got, Unavailable):
        return PowerSamples(()) if got.code == 6 else got  # NOT_FOUND: none newer than since_us
    _, samples = got
    points = []
    for s in sorted(samples, key=lambda s: s.timeStamp):
        value = s.sampleValue
        mw = next((v for f in ("uiVal", "ulVal", "ullVal") if (v := getattr(value, f, None)) is not None), None)
        if isinstance(mw, int) and 0 <= mw < 10**8:  # under 100 kW: a reading, not garbage
            points.append((int(s.timeStamp), mw / 1000.0))
    return PowerSamples(tuple(points))


def read_pcie(nvml: NvmlSession, index: int, clock: Callable[[], float] = time.monotonic) -> PcieReading:
    tx = nvml.device_query(index, "nvmlDeviceGetPcieThroughput", PCIE_TX_BYTES)
    rx = nvml.device_query(index, "nvmlDeviceGetPcieThroughput", PCIE_RX_BYTES)
    return PcieReading(index, clock(), tx * KB if is_available(tx) else tx, rx * KB if is_available(rx) else rx)
