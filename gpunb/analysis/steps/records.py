"""The records of how close a profiled cell came to the hardware: FLOPs of one counted step
and what they mean against the step time (:mod:`gpunb.analysis.profile.throughput`), and the top
operations of a few traced steps (:mod:`gpunb.analysis.steps.op_trace`). Both hang off the
:class:`~gpunb.analysis.profile.records.CellProfile` (``flops`` and ``ops``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlopCount:
    """What ran in one training step, counted by :mod:`gpunb.analysis.steps.flop_count`."""

    step: int  # 0-based index of the counted optimizer step (1: the cell's second step)
    flops: int  # matmul, convolution and attention FLOPs (torch.utils.flop_counter's formulas)
    by_precision: dict[str, float]  # "bf16" | "fp16" | "tf32" | "fp32" | "fp8" | "fp64" | "other" -> FLOPs
    by_op: dict[str, float]  # "aten.mm" -> FLOPs
    bytes_moved: int  # estimate: bytes every operation read and wrote (see flop_count.py)
    ops: int  # operations seen
    host_ms: float  # the counted step on the host clock (counting slows it; it is left out of the step times)
    uncounted: str = ""  # what ran without being counted, and why
    gpu_flops: int = 0  # of ``flops``, those computed on a GPU

    def precision_mix(self) -> list[tuple[str, float]]:
        """(precision, share of the FLOPs), largest first."""
        if self.flops <= 0:
            return []
        return sorted(((p, f / self.flops) for p, f in self.by_precision.items() if f), key=lambda x: -x[1])


@dataclass(frozen=True)
class Throughput:
    """FLOPs per step, achieved TFLOP/s and MFU (model FLOPs utilization) of a profiled cell."""

    count: FlopCount | None
    why_not: str  # why nothing was counted ("" when ``count`` is set)
    step_ms: float | None  # the median step time the rates use
    achieved_tflops: float | None  # FLOPs per step / median step time
    gpu_model: str = ""  # the datasheet entry used ("H200"), "" without one
    peak_tflops: float | None = None  # datasheet peak for this step's precision mix
    mfu: float | None = None  # achieved / datasheet peak (0.48 = 48 %)
    measured_peak_tflops: float | None = None  # the same mix at the peaks %gpucheck measured
    mfu_measured: float | None = None
    measured_source: str = ""  # "%gpucheck in this kernel, 2026-11-30 14:02" or why there is none
    bandwidth_gbps: float | None = None  # estimated bytes per step / median step time
    peak_bandwidth_gbps: float | None = None  # datasheet memory bandwidth
    memory_bound: bool | None = None  # at the datasheet peaks the step's bytes take longer than its math

    @property
    def flops_per_step(self) -> int | None:
        return self.count.flops if self.count is not None else None


@dataclass(frozen=True)
class OpRow:
    name: str
    category: str  # matmul | attention | elementwise | communication | copies | other
    calls: int  # per traced step
    ms_per_step: float  # GPU time (CPU time on a CPU-only run) per traced step
    share: float  # of the traced window


@dataclass(frozen=True)
class OpsReport:
    """``%%gpuprofile --ops``: torch.profiler over a few steps, summarized."""

    device_time: bool  # True: shares are of GPU time (kernels); False: CPU time of operators
    steps: tuple[int, ...]  # 0-based indices of the traced (active) steps
    window_ms: float  # per traced step: the span the shares are of
    # category -> share of the window ("idle": GPU idle, or host time outside operators on a CPU)
    shares: dict[str, float]
    top_ops: tuple[OpRow, ...]
    top_kernels: tuple[OpRow, ...]  # empty on a CPU-only run
    trace_path: str  # the Chrome/Perfetto trace ("" when it could not be written)
    trace_bytes: int | None
    processing_s: float  # time spent turning the trace into this summary and the file, at the cell's end
    note: str = ""  # a partial trace, a trace written elsewhere, why nothing was traced
