"""How close a profiled cell came to the hardware: achieved TFLOP/s, MFU and memory bandwidth
from the FLOPs of one counted step (:mod:`gpunb.analysis.steps.flop_count`) and the median step
time; and the advice that follows from them and from a ``--ops`` trace.

MFU (model FLOPs utilization) = achieved FLOP/s / the peak for the precisions the step ran
in. With a mix (bf16 matmuls and a few fp32 ones) the peak is the mix's: the time the step's
FLOPs of each precision would take at that precision's peak, summed. It is given against
the datasheet (``gpu_specs.py``) and, when ``%gpucheck`` measured this GPU (in this kernel
or earlier, ``readings/peak_cache.py``), against what the GPU really reached in an 8192²
matmul: on the H200 here bf16 790 TFLOP/s, 80 % of the 989 on the datasheet. FLOPs are what
ran: with activation checkpointing the recomputed forward counts too (hardware FLOPs).

Memory-bound: at the datasheet peaks, moving the step's (estimated) bytes takes longer than
its math; then the achieved bandwidth is shown against the datasheet's.
"""

from __future__ import annotations

from gpunb.analysis.advice import Advice
from gpunb.analysis.gpu_specs import peak_for
from gpunb.analysis.steps.records import FlopCount, OpsReport, Throughput
from gpunb.readings.peak_cache import MeasuredPeaks

NEGLIGIBLE = 0.01  # FLOPs of a precision without a peak figure below this share are left out of MFU
ELEMENTWISE_SHARE = 0.30  # of the traced GPU time: worth fusing
IDLE_SHARE = 0.30
COMMUNICATION_SHARE = 0.20
MEMCPY_SHARE = 0.10


def _ideal_s(count: FlopCount, peaks: dict[str, float | None]) -> float | None:
    """Seconds the step's FLOPs take at ``peaks`` (TFLOP/s per precision); None when FLOPs of a
    precision without a figure are more than negligible."""
    total, unknown = 0.0, 0.0
    for precision, flops in count.by_precision.items():
        peak = peaks.get(precision)
        if peak:
            total += flops / (peak * 1e12)
        else:
            unknown += flops
    if unknown > NEGLIGIBLE * count.flops or total <= 0:
        return None
    return total


def assess(count: FlopCount | None, why_not: str, step_ms: float | None, gpu_name: str | None,
           measured: MeasuredPeaks | None = None, measured_note: str = "") -> Throughput:
    """The rates of a cell. ``gpu_name``: the CUDA device the cell trained on (None: the CPU).
    ``measured_note``: why a cached measurement of this GPU was ignored, if one was."""
    if count is None:
        return Throughput(None, why_not or "not counted", step_ms, None)
    step_s = step_ms / 1000.0 if step_ms else None
    achieved = count.flops / step_s / 1e12 if step_s else None
    spec = peak_for(gpu_name) if gpu_name else None
    if spec is None:
        return Throughput(count, "", step_ms, achieved)
    sheet = {p: spec.tflops(p) for p in count.by_precision}
    ideal = _ideal_s(count, sheet) if count.flops else None
    peak = count.flops / ideal / 1e12 if ideal else None
    mfu = achieved / peak if achieved is not None and peak else None
    measured_peak = mfu_measured = None
    source = measured_note or "no %gpucheck measurement of this GPU yet (run %gpucheck)"
    if measured is not None:
        ideal_m = _ideal_s(count, dict(measured.tflops)) if count.flops else None
        if ideal_m:
            measured_peak = count.flops / ideal_m / 1e12
            mfu_measured = achieved / measured_peak if achieved is not None else None
            source = measured.source()
        else:
            missing = sorted(p for p in count.by_precision if p not in measured.tflops)
            source = f"%gpucheck measured no {'/'.join(missing)} peak" if missing else source
    bandwidth = memory_bound = None
    if spec.memory_gbps and count.bytes_moved:
        bandwidth = count.bytes_moved / step_s / 1e9 if step_s else None
        memory_s = count.bytes_moved / (spec.memory_gbps * 1e9)
        memory_bound = memory_s > (ideal or 0.0)
    return Throughput(count, "", step_ms, achieved, spec.model, peak, mfu, measured_peak, mfu_measured, source,
                      bandwidth, spec.memory_gbps, memory_bound)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def throughput_advice(t: Throughput | None, ops: OpsReport | None, verdict_kind: str) -> list[Advice]:
    """Advice that follows from the FLOP count and from a --ops trace."""
    advice: list[Advice] = []
    if t is not None and t.count is not None and t.memory_bound and t.bandwidth_gbps is not None:
        c = t.count
        advice.append(Advice(
            "Fuse the memory-bound work",
            f"the step moves ~{c.bytes_moved / 1e9:.1f} GB (estimated) for {c.flops / 1e12:.2f} TFLOP: at the "
            f"{t.gpu_model}'s peaks its memory traffic takes longer than its math; achieved "
            f"{t.bandwidth_gbps:.0f} GB/s of {t.peak_bandwidth_gbps:.0f}",
            "model = torch.compile(model) fuses elementwise chains; bf16 activations halve the bytes"))
    if ops is None or not ops.shares:
        return advice
    where = "GPU time" if ops.device_time else "CPU time"
    steps = _steps_words(ops.steps)
    elementwise = ops.shares.get("elementwise", 0.0)
    if elementwise >= ELEMENTWISE_SHARE:
        advice.append(Advice("Fuse elementwise kernels: try torch.compile",
                             f"{_pct(elementwise)} of {where} in {steps} went to elementwise and reduction "
                             "operations, each reading and writing its tensors in full",
                             "model = torch.compile(model)", gain=None))
    idle = ops.shares.get("idle", 0.0)
    if ops.device_time and idle >= IDLE_SHARE and verdict_kind not in ("input-bound", "sync-bound"):
        advice.append(Advice("Keep the GPU fed between kernels",
                             f"the GPU idled {_pct(idle)} of {steps}: many small kernels launched one by one",
                             "a larger batch; torch.compile(model, mode='reduce-overhead') (CUDA graphs)"))
    comm = ops.shares.get("communication", 0.0)
    if comm >= COMMUNICATION_SHARE:
        advice.append(Advice("Communicate less often, or overlap it",
                             f"{_pct(comm)} of {where} in {steps} went to NCCL communication",
                             "gradient accumulation with model.no_sync(); DDP(..., bucket_cap_mb=...) to overlap"))
    copies = ops.shares.get("copies", 0.0)
    if ops.device_time and copies >= MEMCPY_SHARE:
        advice.append(Advice("Copy less between host and GPU",
                             f"{_pct(copies)} of GPU time in {steps} went to memory copies and sets",
                             "keep tensors on the GPU; DataLoader(pin_memory=True) and .to('cuda', non_blocking=True)"))
    return advice


def _steps_words(steps: tuple[int, ...]) -> str:
    if not steps:
        return "the traced steps"
    first, last = steps[0] + 1, steps[-1] + 1
    return f"step {first}" if first == last else f"steps {first}-{last}"
