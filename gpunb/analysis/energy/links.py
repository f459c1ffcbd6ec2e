"""What a profiled cell moved over its links: PCIe in each direction (NVML's throughput, sampled
in the background at the step marks) and, for multi-GPU cells, NVLink bytes (the ranks'
``TrafficMeter`` counters, which the profile hands in).

``nvmlDeviceGetPcieThroughput`` answers the rate of a short window (a few tens of ms), not a
running count, so the cell's PCIe figures are *sampled*: the average of the readings taken at
most every ``PCIE_EVERY_S`` while the cell ran, and bytes as that average times the cell's
length. The record says how many readings it rests on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpunb.readings.energy import read_pcie
from gpunb.readings.nvml import NvmlSession, PendingRun, is_available

PCIE_EVERY_S = 0.5  # each reading holds the NVML worker a few tens of ms: not at every energy mark


@dataclass(frozen=True)
class PcieTraffic:
    """One GPU's PCIe traffic during a cell, from ``samples`` throughput readings."""

    index: int  # NVML's
    rx_bytes_s: float  # host -> GPU, average of the readings
    tx_bytes_s: float  # GPU -> host
    peak_rx_bytes_s: float
    samples: int
    seconds: float

    @property
    def rx_bytes(self) -> float:
        return self.rx_bytes_s * self.seconds

    @property
    def tx_bytes(self) -> float:
        return self.tx_bytes_s * self.seconds


@dataclass(frozen=True)
class CellLinks:
    """PCIe per GPU (sampled) and NVLink bytes per GPU (counted) during one cell, with the
    host->GPU peak it is measured against (``%gpucheck``'s pinned copy, else the datasheet)."""

    pcie: tuple[PcieTraffic, ...] = ()
    nvlink_bytes: dict[int, int] = field(default_factory=dict)  # NVML index -> bytes sent + received
    seconds: float = 0.0
    h2d_peak_gbps: float | None = None
    h2d_peak_source: str = ""  # "%gpucheck's pinned copy" / "PCIe gen5 x16 datasheet"
    nvlink_peak_gbps: float | None = None  # one GPU, one direction: links x per-link speed
    note: str = ""

    @property
    def rx_gbps(self) -> float | None:
        """Host -> GPU, GB/s, summed over the GPUs."""
        return sum(p.rx_bytes_s for p in self.pcie) / 1e9 if self.pcie else None

    @property
    def tx_gbps(self) -> float | None:
        return sum(p.tx_bytes_s for p in self.pcie) / 1e9 if self.pcie else None

    @property
    def nvlink_gbps(self) -> float | None:
        """NVLink GB/s per GPU (the busiest), sent + received, over the cell."""
        if not self.nvlink_bytes or self.seconds <= 0:
            return None
        return max(self.nvlink_bytes.values()) / self.seconds / 1e9


def _read_rates(nvml: NvmlSession, indices: Sequence[int]) -> dict[int, tuple[float, float]]:
    out = {}
    for i in indices:
        got = read_pcie(nvml, i)
        if is_available(got.rx_bytes_s) and is_available(got.tx_bytes_s):
            out[i] = (float(got.rx_bytes_s), float(got.tx_bytes_s))
    return out


def _no_rates(_why: str) -> dict[int, tuple[float, float]]:
    return {}


class PcieMeter:
    """PCIe throughput of the cell's GPUs, read by the NVML worker at step marks at most every
    ``PCIE_EVERY_S`` (a step never waits) and once at the end. ``indices`` may be set late (the
    cell started CUDA itself): readings begin once it is known."""

    def __init__(self, nvml: NvmlSession, indices: Sequence[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml, self.clock, self.indices = nvml, clock, tuple(indices)
        self.t0 = clock()
        self.readings: list[dict[int, tuple[float, float]]] = []
        self._pending: PendingRun[dict[int, tuple[float, float]]] | None = None
        self._asked_at = -1e9
        if self.indices:
            self._ask(0.0)

    def _ask(self, now: float) -> None:
        self._asked_at = now
        self._pending = self.nvml.run_soon(_read_rates, self.nvml, self.indices, fallback=_no_rates,
                                           budget_s=self.nvml.call_timeout_s, what="the PCIe throughput")

    def at_step(self) -> None:
        """A step mark: keep the reading that came back, ask for the next when due (never waits)."""
        pending = self._pending
        if pending is not None:
            if not pending.ready():
                return
            self.readings.append(pending.result())
            self._pending = None
        now = self.clock() - self.t0
        if self.indices and now - self._asked_at >= PCIE_EVERY_S:
            self._ask(now)

    def finish(self, indices: Sequence[int]) -> tuple[PcieTraffic, ...]:
        """Per GPU of ``indices`` that was sampled while the cell ran: the average of the
        readings (one more at the end). A GPU read only at the end is left out: that reading
        comes after the cell's work."""
        seconds = self.clock() - self.t0
        if self._pending is not None:
            self.readings.append(self._pending.result())
            self._pending = None
        sampled = [i for i in indices if i in self.indices]
        if not sampled:
            return ()
        self.readings.append(_read_rates(self.nvml, sampled))
        out = []
        for i in sampled:
            rates = [r[i] for r in self.readings if i in r]
            if rates:
                out.append(PcieTraffic(i, sum(r[0] for r in rates) / len(rates), sum(r[1] for r in rates) / len(rates),
                                       max(r[0] for r in rates), len(rates), seconds))
        return tuple(out)
