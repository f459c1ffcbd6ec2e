"""The cheap per-cell measurement behind ``%gpuprofile on``: no hooks inside the cell.

At cell start: a clock, (optionally) torch's peak counter reset, the RSS peak reset, an NVML
timestamp and, when CUDA is up, the GPUs' energy counters (on the NVML worker: the cell's GPU is
known only at its end). At cell end: one ``synchronize`` (so the time includes the GPU work the
cell queued), one read of torch's peak counter, one NVML samples call and one energy counter read
(on the NVML worker while the GPU finishes; skipped for cells shorter than NVML's sampling and
counter can describe), one ``/proc/self/status`` read. Nothing per training step;
``benchmarks/profile_overhead.py`` times each of these on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpunb.analysis.energy.meter import read_counters
from gpunb.readings import torch_state
from gpunb.readings.devices import read_device_map
from gpunb.readings.gpu_activity import UtilWindow, now_us, read_util_since
from gpunb.readings.nvml import NvmlSession, PendingRun, default_session
from gpunb.readings.process import read_process_usage, reset_peak_rss

# NVML keeps about 5 utilization samples a second on an H200 (research anchors §1.1) and
# reading them costs ~2 ms at a cell's end (nvmlDeviceGetSamples; benchmarks/profile_overhead.py
# on the H200). A cell shorter than this gets no utilization and no NVML call: then the
# meter's cost stays under 0.13 % of any cell (2.5 ms of a 2 s cell; ~0.1 ms otherwise),
# inside the one-line mode's 0.2 % budget, and a 1 s cell would have only ~5 samples.
UTIL_MIN_S = 2.0
# The end's energy counter read costs ~2.6 ms more (benchmarks/energy_accuracy.py, H200): from 3 s
# on both reads stay under 0.16 % of the cell. The counter moves every ~90 ms, so a 3 s cell's
# figure is within a few percent.
ENERGY_MIN_S = 3.0


@dataclass(frozen=True)
class CellLine:
    """One cell measured by the one-line mode (also an entry of ``%gpuprofile history``)."""

    wall_s: float
    synced_wall_s: float | None
    peak_vram_bytes: int | None
    util_pct: float | None
    peak_rss_bytes: int | None
    gpu_note: str = ""
    cell: int | None = None  # In [n]
    label: str = ""  # the cell's first line of code
    energy_j: float | None = None  # the cell's GPU's energy counter, end minus start (cells >= UTIL_MIN_S)


class CellMeter:
    def __init__(self, reset_peak: bool = True, nvml: NvmlSession | None = None) -> None:
        self.reset_peak = reset_peak
        self.nvml = nvml
        self._t0: float | None = None

    def start(self) -> None:
        torch = torch_state.imported_torch()
        self._peak_before = None
        self._counters: PendingRun[dict[int, int]] | None = None  # a cell that starts CUDA gets no energy
        if torch_state.cuda_initialized(torch):
            dev = torch_state.current_device(torch)
            if self.reset_peak:
                torch.cuda.reset_peak_memory_stats(dev)
            else:
                self._peak_before = torch_state.read_allocator(torch, dev).peak_allocated_bytes
            nvml = self.nvml or default_session()
            self._counters = nvml.run_soon(read_counters, nvml, None, fallback=_no_counters, what="the energy counters")
        self._rss_reset = reset_peak_rss()
        self._since = now_us()
        self._t0 = time.perf_counter()

    def stop(self) -> CellLine | None:
        if self._t0 is None:
            return None
        wall = time.perf_counter() - self._t0
        torch = torch_state.imported_torch()
        synced = peak = util = energy = None
        note = ""
        if torch_state.cuda_initialized(torch):
            try:
                dev = torch_state.current_device(torch)
                # a long cell's utilization is read on the NVML worker while the GPU finishes
                reads = self._util_soon(torch, dev, wall) if wall >= UTIL_MIN_S else None
                torch.cuda.synchronize()
                synced = time.perf_counter() - self._t0
                peak = torch_state.read_allocator(torch, dev).peak_allocated_bytes
                if self._peak_before is not None and peak <= self._peak_before:
                    peak, note = None, "peak VRAM not above the earlier peak"
                if reads is None and synced >= UTIL_MIN_S:  # long only with the GPU's queue
                    reads = self._util_soon(torch, dev, synced)
                if reads is not None:
                    start = self._counters.result() if self._counters is not None else {}
                    util, energy = _energy_since(start, *reads.result())
            except Exception as exc:  # a broken CUDA context: say so, never break the cell
                note = f"CUDA unreadable ({type(exc).__name__})"
        usage = read_process_usage(peak_was_reset=self._rss_reset)
        self._t0 = None
        return CellLine(wall, synced, peak, util, usage.peak_rss_bytes if usage.peak_since_reset else None, note,
                        energy_j=energy)

    def _util_soon(self, torch: Any, dev: int, seconds: float) -> PendingRun[tuple[float | None, int | None,
                                                                                   int | None]]:
        nvml = self.nvml or default_session()
        return nvml.run_soon(_gpu_at_end, nvml, torch, dev, self._since, seconds >= ENERGY_MIN_S,
                             fallback=_nothing_at_end, what="the cell's GPU utilization and energy")


def _gpu_at_end(nvml: NvmlSession, torch: Any, dev: int, since_us: int,
                energy: bool) -> tuple[float | None, int | None, int | None]:
    """On the NVML worker: (mean utilization since ``since_us``, NVML index, energy counter in mJ,
    read only when ``energy``) of torch's device ``dev``."""
    if not nvml.device_count():
        return None, None, None
    index = read_device_map(nvml, torch=torch).nvml_index(dev)  # kept per session once CUDA is up
    if index is None:
        return None, None, None
    window = read_util_since(nvml, index, since_us)
    counter = read_counters(nvml, [index]).get(index) if energy else None
    return window.mean_pct if isinstance(window, UtilWindow) else None, index, counter


def _nothing_at_end(why: str) -> tuple[None, None, None]:
    return None, None, None


def _no_counters(why: str) -> dict[int, int]:
    return {}


def _energy_since(start: dict[int, int], util: float | None, index: int | None,
                  end_mj: int | None) -> tuple[float | None, float | None]:
    """(utilization, joules): the energy is left out without both counter readings."""
    before = start.get(index) if index is not None else None
    if before is None or end_mj is None or end_mj < before:
        return util, None
    return util, (end_mj - before) / 1000.0
