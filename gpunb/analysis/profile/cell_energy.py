"""What a profiled cell's GPUs spent and moved: the energy meter and the PCIe sampler of one
cell (``analysis/energy``), fed at the step marks, and read once at its end for the GPUs the
cell used (the kernel's device, and every GPU its ranks trained on).

The energy counters of every GPU are read at the start (in the background), because a cell that
starts CUDA or worker processes names its GPUs only at its end. PCIe is sampled on the kernel's
GPU, and the step marks are read as its counter moves, from the moment it is known: at the start
when CUDA is already up, else from the first step that finds CUDA up (its NVML index is looked
up on the NVML worker meanwhile).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpunb.analysis.energy.links import CellLinks, PcieMeter
from gpunb.analysis.energy.meter import CellEnergy, EnergyMeter
from gpunb.analysis.gpu_specs import pcie_gbps
from gpunb.analysis.profile.link_verdict import nvlink_peak_gbps, with_links
from gpunb.analysis.profile.records import CellProfile, StepStats
from gpunb.readings import torch_state
from gpunb.readings.devices import read_device_map
from gpunb.readings.nvml import NvmlSession, PendingRun, is_available
from gpunb.readings.peak_cache import lookup

NO_GPU = "the cell used no GPU, so no energy was measured"
NO_NVML = ("NVML did not name the cell's GPU (no NVIDIA driver library here, or CUDA's device could not be "
           "matched to NVML's), so its energy counter could not be read")
NO_READING = "NVML gave neither an energy counter nor power samples for {gpus}"


def check_energy_options(energy: object, tokens_per_sample: object) -> None:
    if not isinstance(energy, bool):
        raise TypeError(f"energy must be True or False, got {energy!r}")
    if tokens_per_sample is not None and (not isinstance(tokens_per_sample, int)
                                          or isinstance(tokens_per_sample, bool) or tokens_per_sample < 1):
        raise ValueError(f"tokens_per_sample must be a whole number >= 1 (the sequence length), "
                         f"got {tokens_per_sample!r}")


class CellMeters:
    """The energy meter and PCIe sampler of one profiled cell; ``at_step`` is the step hook's
    callback (``Instruments.step_meter``): it never waits for NVML."""

    def __init__(self, nvml: NvmlSession, kernel_index: int | None, torch: Any = None) -> None:
        self.nvml, self.torch = nvml, torch
        self._finding = kernel_index is None  # the kernel's GPU is looked up once CUDA is up
        self._lookup: PendingRun[int | None] | None = None
        # step marks read as the kernel GPU's counter moves (meter.FRESH_WAIT_S), when it is known;
        # on the steps' clock (Instruments: perf_counter), so a mark can be put among the steps
        self.energy = EnergyMeter(nvml, None, clock=time.perf_counter, fresh=kernel_index)
        self.pcie = PcieMeter(nvml, (kernel_index,) if kernel_index is not None else (), clock=time.perf_counter)

    def at_step(self, steps: int) -> None:
        if self._finding:
            self._find_kernel_gpu()
        self.energy.at_step(steps)
        self.pcie.at_step()

    def _find_kernel_gpu(self) -> None:
        """At a step: once CUDA is up, ask the NVML worker for the current device's NVML index;
        once it answered, sample that GPU (never waits)."""
        lookup = self._lookup
        if lookup is None:
            torch = self.torch if self.torch is not None else torch_state.imported_torch()
            if torch is not None and not getattr(getattr(torch, "version", None), "cuda", None):
                self._finding = False  # a CPU-only torch never brings CUDA up
                return
            if not torch_state.cuda_initialized(torch):
                return
            try:
                dev = torch_state.current_device(torch)
            except Exception:  # a broken CUDA context: the profile says so elsewhere
                self._finding = False
                return
            self._lookup = self.nvml.run_soon(_nvml_index, self.nvml, torch, dev, fallback=_no_index,
                                              what="the cell's GPU")
        elif lookup.ready():
            index, self._finding = lookup.result(), False
            if index is not None:
                self.energy.fresh = index
                self.pcie.indices = (index,)

    def finish(self, used: Sequence[int], *, warmup_steps: int, batch_size: int | None,
               idle_time_share: float | None, tokens_per_sample: int | None,
               nvlink_bytes: dict[int, int] | None = None, uuid: str | None = None,
               nvlink_peak_gbps: float | None = None,
               steps_at: Callable[[float], int] | None = None) -> tuple[CellEnergy | None, str, CellLinks | None]:
        """(energy, why there is none, link traffic) on the NVML indices ``used``."""
        used = tuple(sorted(set(used)))
        if not used:
            self.energy.finish(indices=())  # the last mark's reading is taken back; nothing to report
            return None, NO_GPU, None
        energy = self.energy.finish(warmup_steps=warmup_steps, batch_size=batch_size,
                                    idle_time_share=idle_time_share, indices=used, steps_at=steps_at)
        why = "" if energy is not None else NO_READING.format(gpus=_gpus(used))
        if energy is not None and tokens_per_sample:
            energy = dataclasses.replace(energy, tokens_per_sample=tokens_per_sample)
        pcie = self.pcie.finish(used)
        seconds = energy.seconds if energy is not None else self.pcie.clock() - self.pcie.t0
        peak, source = h2d_peak(self.nvml, used[0], uuid)
        nvlink = {i: b for i, b in (nvlink_bytes or {}).items() if i in used}
        links = CellLinks(pcie, nvlink, seconds, peak, source, nvlink_peak_gbps if nvlink else None) \
            if pcie or nvlink else None
        return energy, why, links


def _nvml_index(nvml: NvmlSession, torch: Any, dev: int) -> int | None:
    return read_device_map(nvml, torch=torch).nvml_index(dev)


def _no_index(_why: str) -> None:
    return None


def _gpus(indices: Sequence[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def h2d_peak(nvml: NvmlSession, index: int, uuid: str | None) -> tuple[float | None, str]:
    """Host->GPU GB/s the cell's traffic is measured against: what ``%gpucheck``'s pinned copy
    reached on this GPU (the peak cache), else the link's datasheet rate."""
    measured = lookup(uuid) if uuid else None
    if measured is not None and measured.h2d_gbps:
        return measured.h2d_gbps, f"%gpucheck's pinned copy, {measured.measured_at}"
    gen = nvml.device_query(index, "nvmlDeviceGetMaxPcieLinkGeneration")
    width = nvml.device_query(index, "nvmlDeviceGetMaxPcieLinkWidth")
    if is_available(gen) and is_available(width) and isinstance(gen, int) and isinstance(width, int):
        rate = pcie_gbps(gen, width)
        if rate:
            return rate, f"PCIe gen{gen} x{width} datasheet"
    return None, ""


def steady_from(steps: StepStats, warmup_steps: int) -> int:
    """The first step the per-step energy counts: after the warm-up and after the steps a closer
    look slowed (the FLOP count of step 2, --ops), whose idle GPU time is not a training step's."""
    return max([warmup_steps] + [i + 1 for i in steps.excluded])


def gpu_steps_at(profile: CellProfile, cell_t0: float, meter_t0: float) -> Callable[[float], int] | None:
    """The steps the GPU had finished ``t`` seconds into the meter's time, from the steps' CUDA
    events (step i ended sum(step_ms[:i+1]) after the cell's start event, recorded at about
    ``cell_t0``); None when the steps were timed by the host clock only."""
    st = profile.steps
    if not st.source.startswith("CUDA events") or not st.step_ms:
        return None
    offset = cell_t0 - meter_t0
    done = [offset + ms / 1000.0 for ms in itertools.accumulate(st.step_ms)]
    return lambda t: bisect.bisect_right(done, t)


def with_energy(profile: CellProfile, meters: CellMeters, *, warmup_steps: int, torch: Any,
                tokens_given: int | None, tokens_seen: int | None, cell_t0: float) -> CellProfile:
    """``profile`` with its energy and link traffic on the GPUs it used (its own, its ranks'),
    its tokens per sample (given, else seen in the first batch), and the links in its verdict."""
    gpu, part = profile.gpu, profile.ranks
    used = {gpu.nvml_index} if gpu is not None and gpu.nvml_index is not None else set()
    used |= {r.nvml_index for r in part.ranks if r.nvml_index is not None} if part is not None else set()
    tokens = tokens_given or tokens_seen
    steps = dataclasses.replace(profile.steps, tokens_per_sample=tokens, tokens_given=tokens_given is not None)
    try:
        uuid = torch_state.device_uuid(torch, gpu.device) if gpu is not None else None
        energy, why, links = meters.finish(
            sorted(used), warmup_steps=steady_from(steps, warmup_steps), batch_size=steps.batch_size,
            idle_time_share=gpu.util_idle_share if gpu is not None else None, tokens_per_sample=tokens,
            nvlink_bytes=part.nvlink_traffic if part is not None else None, uuid=uuid,
            nvlink_peak_gbps=nvlink_peak_gbps(part.link) if part is not None else None,
            steps_at=gpu_steps_at(profile, cell_t0, meters.energy.t0))
    except Exception as exc:  # a reading gpunb did not expect: the rest of the report still stands
        energy, links = None, None
        why = f"the energy readings failed ({type(exc).__name__}: {exc}); please report this to gpunb"
    if not used and gpu is not None:
        why = NO_NVML
    return dataclasses.replace(profile, steps=steps, energy=energy, energy_absent=why, links=links,
                               verdict=with_links(profile.verdict, links))
