"""The records of a profiled cell: what :mod:`gpunb.analysis.profile.cell` measures, what
:mod:`gpunb.analysis.profile.verdict` judges and :mod:`gpunb.views.profile_view` shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.advice import Advice
from gpunb.analysis.energy.links import CellLinks
from gpunb.analysis.energy.meter import CellEnergy
from gpunb.analysis.leaks.records import LeakReport
from gpunb.analysis.ranks.records import RanksPart
from gpunb.analysis.steps.records import OpsReport, Throughput
from gpunb.display import DisplayMixin


@dataclass(frozen=True)
class StepStats:
    count: int  # optimizer steps seen (first optimizer only)
    skipped: int  # warm-up steps left out of median/p90
    first_ms: float | None  # the first step, from the start of the cell (includes warm-up work)
    median_ms: float | None
    p90_ms: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    batch_size: int | None
    source: str  # "CUDA events" (maybe "... every ~N steps, split by the host clock") or "host clock"
    step_ms: tuple[float, ...] = ()  # every step, in order (step 0 from the cell start)
    # 0-based steps left out of median/p90 besides the warm-up: counted for FLOPs, traced by --ops
    excluded: tuple[int, ...] = ()
    tokens_per_sample: int | None = None  # the batch's sequence length: detected from token ids, or given
    tokens_given: bool = False  # --tokens-per-sample / tokens_per_sample= (else detected)

    @property
    def tokens_per_s(self) -> float | None:
        return self.samples_per_s * self.tokens_per_sample if self.samples_per_s and self.tokens_per_sample else None


@dataclass(frozen=True)
class GpuPart:
    device: int  # torch's index
    nvml_index: int | None
    name: str
    total_bytes: int | None
    peak_allocated_bytes: int | None  # None with --no-reset when the old peak was not exceeded
    peak_reserved_bytes: int | None
    end_allocated_bytes: int
    end_reserved_bytes: int
    nvml_process_bytes: int | None  # this process as NVML sees it, at the end of the cell
    nvml_device_peak_bytes: int | None  # highest device-wide "used" seen at step-end samples (all processes)
    other_processes_bytes: int | None  # processes that are not this kernel's (nor its children)
    alloc_retries: int  # during the cell
    ooms: int  # during the cell
    util_mean_pct: float | None
    util_idle_share: float | None
    util_samples: int
    compute_capability: tuple[int, int] | None
    peak_reset: bool
    child_processes_bytes: int | None = None  # this kernel's child processes on the GPU (DataLoader workers, ranks)
    process_match: str = ""  # how NVML's process list was matched to this kernel (readings.devices.OWN_*)


@dataclass(frozen=True)
class TimeShares:
    loop_s: float  # from the first batch (or cell start) to the last step (or cell end)
    data_wait_s: float
    batches: int
    sync_n: int
    sync_gpu_n: int
    sync_s: float
    sync_gpu_s: float
    sync_by_method: dict[str, int]
    output_s: float
    output_writes: int
    output_chars: int
    loader_workers: int | None
    loader_pin_memory: bool | None
    loop_start_s: float | None = None  # when the loop began, in seconds from the cell start

    def share(self, seconds: float) -> float:
        return seconds / self.loop_s if self.loop_s > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    # input-bound | sync-bound | compute-bound | memory-bound | on-cpu | cpu-only | output-bound | host-bound
    # | multi-gpu | multi-process (ranks that all trained on the CPU) | none
    kind: str
    headline: str
    reason: str


@dataclass(frozen=True)
class CellProfile(DisplayMixin):
    """One profiled cell (``%%gpuprofile``, ``gpunb.profile()``): what was measured, its verdict
    and ranked advice."""

    label: str
    cell: int | None
    started: str  # local wall-clock time, ISO
    wall_s: float
    synced_wall_s: float | None  # until the GPU finished the cell's work
    gpu_time_s: float | None  # CUDA events, cell start to end
    cpu_s: float
    peak_rss_bytes: int | None
    peak_rss_is_cell: bool
    steps: StepStats
    shares: TimeShares
    gpu: GpuPart | None
    gpu_absent: str  # why there is no GPU part ("" when there is one)
    gpu_visible: str  # name of a GPU NVML sees ("" when none), for the on-the-CPU verdict
    torch_version: str | None
    torch_cuda: str | None
    matmul_precision: str | None
    param_devices: tuple[str, ...]
    param_dtypes: tuple[str, ...]
    param_count: int
    optimizers: int
    memory_timeline: tuple[tuple[float, int, int | None], ...]  # (s since start, bytes, reserved)
    step_marks_s: tuple[float, ...]
    error: str = ""  # "ValueError: ..." when the cell raised
    verdict: Verdict = Verdict("none", "", "")
    advice: tuple[Advice, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    flops: Throughput | None = None  # FLOPs of one counted step, TFLOP/s, MFU (None: not asked for, no steps)
    ops: OpsReport | None = None  # --ops: top operators and kernels of a few traced steps
    driver_cuda: str | None = None  # the newest CUDA the driver supports ("13.0"), from NVML
    ranks: RanksPart | None = None  # the worker processes of a multi-GPU cell (analysis/ranks/summary.py)
    other_thread_steps: int = 0  # optimizer steps other threads took during the cell (not counted as its own)
    energy: CellEnergy | None = None  # what the cell's GPUs spent (analysis/profile/cell_energy.py)
    energy_absent: str = ""  # why there is no energy ("" when there is, or when --no-energy)
    links: CellLinks | None = None  # PCIe (sampled) and NVLink (counted) traffic during the cell
    leak: LeakReport | None = None  # memory that grew every step, and its holder (None: leak=False, no torch)



@dataclass(frozen=True)
class HistoryReport(DisplayMixin):
    """What ``%gpuprofile history`` shows (and binds with ``-o``): the profiled cells in order,
    and for each the index of the earlier run of the same cell it is compared with (None: it
    is the first run of its cell, or a different cell; then no ratio is shown)."""

    entries: tuple[CellProfile, ...]
    baselines: tuple[int | None, ...] = ()
    versus: str = ""  # the label every other cell is compared with (``--vs``); "" for runs of one cell

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        object.__setattr__(self, "baselines", tuple(self.baselines))
