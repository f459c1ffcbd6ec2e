"""The cheap per-cell measurement behind ``%gpuprofile on``: no hooks inside the cell.

At cell start: a clock, (optionally) torch's peak counter reset, the RSS peak reset and
an NVML timestamp. At cell end: one ``synchronize`` (so the time includes the GPU work
the cell queued), one read of torch's peak counter, one NVML samples call (on the NVML
worker while the GPU finishes; skipped for cells shorter than NVML's sampling can
describe), one ``/proc/self/status`` read. Nothing per training step;
``benchmarks/profile_overhead.py`` times each of these on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

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


class CellMeter:
    def __init__(self, reset_peak: bool = True, nvml: NvmlSession | None = None) -> None:
        self.reset_peak = reset_peak
        self.nvml = nvml
        self._t0: float | None = None

    def start(self) -> None:
        torch = torch_state.imported_torch()
        self._peak_before = None
        if torch_state.cuda_initialized(torch):
            dev = torch_state.current_device(torch)
            if self.reset_peak:
                torch.cuda.reset_peak_memory_stats(dev)
            else:
                self._peak_before = torch_state.read_allocator(torch, dev).peak_allocated_bytes
        self._rss_reset = reset_peak_rss()
        self._since = now_us()
        self._t0 = time.perf_counter()

    def stop(self) -> CellLine | None:
        if self._t0 is None:
            return None
        wall = time.perf_counter() - self._t0
        torch = torch_state.imported_torch()
        synced = peak = util = None
        note = ""
        if torch_state.cuda_initialized(torch):
            try:
                dev = torch_state.current_device(torch)
                # a long cell's utilization is read on the NVML worker while the GPU finishes
                reads = self._util_soon(torch, dev) if wall >= UTIL_MIN_S else None
                torch.cuda.synchronize()
                synced = time.perf_counter() - self._t0
                peak = torch_state.read_allocator(torch, dev).peak_allocated_bytes
                if self._peak_before is not None and peak <= self._peak_before:
                    peak, note = None, "peak VRAM not above the earlier peak"
                if reads is None and synced >= UTIL_MIN_S:  # long only with the GPU's queue
                    reads = self._util_soon(torch, dev)
                util = reads.result() if reads is not None else None
            except Exception as exc:  # a broken CUDA context: say so, never break the cell
                note = f"CUDA unreadable ({type(exc).__name__})"
        usage = read_process_usage(peak_was_reset=self._rss_reset)
        self._t0 = None
        return CellLine(wall, synced, peak, util, usage.peak_rss_bytes if usage.peak_since_reset else None, note)

    def _util_soon(self, torch: Any, dev: int) -> PendingRun[float | None]:
        nvml = self.nvml or default_session()
        return nvml.run_soon(_mean_util, nvml, torch, dev, self._since, fallback=_no_util,
                             what="the cell's GPU utilization")


def _mean_util(nvml: NvmlSession, torch: Any, dev: int, since_us: int) -> float | None:
    """On the NVML worker: the mean utilization of torch's device ``dev`` since ``since_us``."""
    if not nvml.device_count():
        return None
    index = read_device_map(nvml, torch=torch).nvml_index(dev)  # kept per session once CUDA is up
    if index is None:
        return None
    window = read_util_since(nvml, index, since_us)
    return window.mean_pct if isinstance(window, UtilWindow) else None


def _no_util(why: str) -> None:
    return None
