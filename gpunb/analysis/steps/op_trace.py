"""``%%gpuprofile --ops``: torch.profiler over a few training steps, driven by the step hook.

torch.profiler costs +17 % (GPU-bound) to +190 % (launch-bound) per step on the H200
(benchmarks/README.md) and its post-processing takes seconds on long traces, so it runs for
three steps only, on a ``torch.profiler.schedule`` that the optimizer-step hook advances
(``profile.step()`` at every step end until the trace is complete):

    step 1       warm-up of the cell (allocations, autotuning): not traced
    step 2       wait (the step whose FLOPs are counted, flop_count.py)
    step 3       profiler warm-up (CUPTI starts; not recorded)
    steps 4-6    recorded
    step 7       pays for stopping the trace (its collection is flushed)

Steps 3 to 7 are left out of the cell's step times. The summary (top operators, top kernels,
time shares) and the Chrome/Perfetto trace file are made at the end of the cell, never in
the middle of the loop. Without ``record_shapes``/``with_stack``/``profile_memory``:
record_shapes keeps tensors alive until profiling ends, and each costs more per operation.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpunb.analysis.steps.profiler_log import quiet_profiler_log
from gpunb.analysis.steps.records import OpRow, OpsReport
from gpunb.analysis.steps.trace_file import write_trace

WAIT, WARMUP, ACTIVE = 1, 1, 3  # counted from the profiler's start at the end of step 1
FIRST_TRACED = 1 + WAIT + WARMUP  # 0-based index of the first recorded step (step 4)
LAST_TOUCHED = FIRST_TRACED + ACTIVE  # the step that pays for stopping the trace (step 7)
TOP = 8

CATEGORIES = ("matmul", "attention", "elementwise", "communication", "copies", "other")

# Kernel names, lower case, first match wins. cuBLAS/CUTLASS GEMMs (sm90_xmma_gemm_..., nvjet_...,
# cutlass::Kernel2<...gemm...>) and cuDNN convolutions are "matmul"; FlashAttention/memory-efficient
# attention kernels are "attention" (checked first: they are CUTLASS kernels too); PyTorch's own
# native kernels and Triton's fused pointwise/reduction kernels are elementwise/memory-bound.
_KERNEL_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "reducescatter",
                       "reduce_scatter", "sendrecv")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("copies", ("memcpy", "memset")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce_kernel", "foreach", "multi_tensor",
                     "softmax", "norm", "triton_poi", "triton_red", "triton_per")),
    ("matmul", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "matmul", "conv", "wgrad", "dgrad", "winograd",
                "triton_tem", "triton_mm")),
    ("elementwise", ("at::native", "triton_")),
)
# Operator names (torch.profiler's "aten::mm"), exact; the rest of aten is elementwise/indexing work.
_OP_NAMES = {
    "matmul": {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
               "aten::_scaled_mm", "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d",
               "aten::conv3d", "aten::mkldnn_convolution", "aten::convolution_backward",
               "aten::cudnn_convolution", "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward"},
    "copies": {"aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone"},
}


def kernel_category(name: str) -> str:
    low = name.lower()
    for category, needles in _KERNEL_RULES:
        if any(n in low for n in needles):
            return category
    return "other"


def op_category(name: str) -> str:
    low = name.lower()
    if "attention" in low or "flash" in low:
        return "attention"
    if low.startswith(("c10d::", "nccl:", "gloo:")) or "all_reduce" in low or "allreduce" in low:
        return "communication"
    for category, names in _OP_NAMES.items():
        if name in names:
            return category
    return "elementwise" if name.startswith("aten::") else "other"


def _short(name: str, width: int = 96) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


class OpTrace:
    """torch.profiler for steps 4-6 of a cell: :meth:`step` at every step end (the hook),
    :meth:`stop` once at the cell's end; then :attr:`report`."""

    def __init__(self, torch: Any, trace_path: Path) -> None:
        self.torch = torch
        self.trace_path = trace_path
        self.prof: Any = None
        self.device = False
        self.started_at: int | None = None  # step index whose end started the profiler
        self.traced: list[int] = []
        self.done = False
        self.error = ""
        self.report: OpsReport | None = None

    @property
    def touched(self) -> set[int]:
        """Steps whose time the profiler changed (warm-up, recorded, and the one after)."""
        if self.started_at is None:
            return set()
        first = self.started_at + 1 + WAIT
        return set(range(first, first + WARMUP + ACTIVE + 1))

    def step(self, index: int) -> bool:
        """At the end of step ``index``; False once the trace needs no more steps."""
        if self.done:
            return False
        try:
            started = self.started_at
            if self.prof is None or started is None:  # (both are set together, by _start)
                self._start(index)
                return True
            with quiet_profiler_log():
                self.prof.step()
            k = index - started - WAIT - WARMUP  # 1.. for the recorded steps
            if 1 <= k <= ACTIVE:
                self.traced.append(index)
            if k >= ACTIVE:
                self.done = True  # the schedule has stopped the trace; the summary waits for the cell's end
        except Exception as exc:  # the profiler must never break the user's loop
            self.error = f"torch.profiler failed ({type(exc).__name__}: {exc})"
            self.done = True
            self._stop_quietly()
        return not self.done

    def _start(self, index: int) -> None:
        profiler = self.torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        # CUDA is up by the end of the first step when the loop uses it; asking earlier could
        # start CUDA in a kernel that never uses it
        if getattr(self.torch.version, "cuda", None) and self.torch.cuda.is_initialized():
            activities.append(profiler.ProfilerActivity.CUDA)
            self.device = True
        self.prof = profiler.profile(activities=activities,
                                     schedule=profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                                     on_trace_ready=lambda prof: None)  # summarized at the cell's end
        with quiet_profiler_log():
            self.prof.start()
        self.started_at = index

    def abandon(self) -> None:
        """Stop the profiler without a summary or a trace file (idempotent)."""
        self.done = True
        self._stop_quietly()

    def _stop_quietly(self) -> None:
        prof = self.prof
        if prof is not None:
            try:
                with quiet_profiler_log():
                    prof.stop()  # a second call (after an interrupted first one) raises, or does nothing
            except Exception:
                pass
        self.prof = None  # only now: a Ctrl-C before this line leaves it for abandon() to stop

    def stop(self) -> OpsReport | None:
        """End of the cell: stop the profiler, write the trace and summarize it."""
        t0 = time.perf_counter()
        prof = self.prof
        if prof is None:
            why = self.error or ("no optimizer step in this cell: --ops traces steps 4-6 of a training loop"
                                 if self.started_at is None else "")
            self.report = self._empty(why, t0) if why else None
            return self.report
        # Recording (the cell ended early): stops the trace and keeps what was recorded; after a
        # complete trace: closes the open "ProfilerStep" range and nothing else.
        self._stop_quietly()
        if not self.traced:
            self.report = self._empty(f"the cell ended before step {FIRST_TRACED + 1}: --ops records steps "
                                      f"{FIRST_TRACED + 1}-{FIRST_TRACED + ACTIVE} of a training loop", t0)
            return self.report
        try:
            self.report = self._summarize(prof, t0)
        except Exception as exc:  # a summary bug must not cost the user their report
            self.report = self._empty(f"the trace could not be summarized ({type(exc).__name__}: {exc})", t0)
        return self.report

    def _empty(self, why: str, t0: float) -> OpsReport:
        return OpsReport(self.device, tuple(self.traced), 0.0, {}, (), (), "", None,
                         time.perf_counter() - t0, why)

    # -- the summary -----------------------------------------------------------------------
    def _summarize(self, prof: Any, t0: float) -> OpsReport:
        events = prof.events()
        steps = [e for e in events if e.name.startswith("ProfilerStep")]
        n = max(len(steps), 1)
        cpu_type = self.torch.autograd.DeviceType.CPU
        kernels = [e for e in events if e.device_type != cpu_type and not _annotation(e)]
        note = "" if len(self.traced) == ACTIVE else f"only {len(self.traced)} of {ACTIVE} steps were recorded"
        if self.device and kernels:
            window_us, shares, by_name = device_summary(events, steps, cpu_type)
            top_kernels = tuple(OpRow(_short(name), kernel_category(name), round(calls / n), us / 1000 / n,
                                      us / window_us)
                                for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP])
            time_of: Callable[[Any], Any] = lambda a: (  # noqa: E731
                getattr(a, "self_device_time_total", None) or getattr(a, "self_cuda_time_total", 0))
        else:
            # Self times partition the recorded host time; the "ProfilerStep" ranges' own self time
            # is the host time outside any operator (Python, the data loader).
            by_category: defaultdict[str, float] = defaultdict(float)
            for e in events:
                if e.device_type == cpu_type:
                    key = "idle" if e.name.startswith("ProfilerStep") else op_category(e.name)
                    by_category[key] += e.self_cpu_time_total
            window_us = max(sum(by_category.values()), 1e-9)
            shares = {c: by_category[c] / window_us for c in (*CATEGORIES, "idle") if by_category.get(c)}
            top_kernels = ()
            time_of = lambda a: a.self_cpu_time_total  # noqa: E731
        averages = [a for a in prof.key_averages()
                    if a.device_type == cpu_type and not a.key.startswith("ProfilerStep") and time_of(a) > 0]
        averages.sort(key=lambda a: -time_of(a))
        top_ops = tuple(OpRow(_short(a.key), op_category(a.key), round(a.count / n), time_of(a) / 1000 / n,
                              time_of(a) / window_us) for a in averages[:TOP])
        path, size, where = self._write_trace(prof)
        return OpsReport(self.device, tuple(self.traced), window_us / 1000 / n, shares, top_ops, top_kernels,
                         path, size, time.perf_counter() - t0, "; ".join(x for x in (note, where) if x))

    def _write_trace(self, prof: Any) -> tuple[str, int | None, str]:
        """The Chrome/Perfetto trace next to the notebook, else privately in the temp directory
        (``trace_file``: torch saves a trace once, and never through another user's path)."""
        return write_trace(prof.export_chrome_trace, self.trace_path)


def device_summary(events: list[Any], steps: list[Any],
                   cpu_type: Any) -> tuple[float, dict[str, float], dict[str, Any]]:
    """GPU side of a trace: (window µs, category shares with "idle", kernel name -> [calls, µs]).

    Only the recorded steps' kernels count. A GPU-bound loop's host runs ahead of the GPU, so
    when recording starts the GPU may still be busy with earlier steps, whose kernels CUPTI
    records too. Each kernel names the operator that launched it (``linked_correlation_id`` is
    that operator's ``id``); the window starts at the first kernel launched by a recorded
    operator, and on one stream every later kernel belongs to the recorded steps. It ends when
    the last kernel or the last step ends. Without such links (another torch) every kernel counts.
    """
    # GPU-side rows that are not kernels: the profiler mirrors user annotations (its own
    # "ProfilerStep#N", torch.optim's "Optimizer.step#SGD.step") onto the GPU timeline; on the
    # H200 they topped the kernel list and pushed the shares past 100 %
    kernels = [e for e in events if e.device_type != cpu_type and not _annotation(e)]
    operators = {e.id for e in events if e.device_type == cpu_type} - {0}  # 0: no link
    linked = [k for k in kernels if getattr(k, "linked_correlation_id", 0) in operators]
    start = min([e.time_range.start for e in kernels] + [e.time_range.start for e in steps])
    if linked:
        first = min(k.time_range.start for k in linked)
        earlier = [k for k in kernels if k.time_range.start < first]
        kernels = [k for k in kernels if k.time_range.start >= first]
        # the GPU still ran earlier steps: it was busy up to here, the window starts with ours
        start = first if earlier else min([first] + [e.time_range.start for e in steps])
    end = max([k.time_range.end for k in kernels] + [e.time_range.end for e in steps])
    window_us = max(end - start, 1e-9)
    by_name: dict[str, list[Any]] = defaultdict(lambda: [0, 0.0])
    by_category: dict[str, float] = defaultdict(float)
    for k in kernels:
        us = k.time_range.elapsed_us()
        row = by_name[k.name]
        row[0] += 1
        row[1] += us
        by_category[kernel_category(k.name)] += us
    shares = {c: by_category[c] / window_us for c in CATEGORIES if by_category.get(c)}
    shares["idle"] = max(0.0, 1 - _union_us([(k.time_range.start, k.time_range.end) for k in kernels]) / window_us)
    return window_us, shares, dict(by_name)


def _annotation(event: Any) -> bool:
    """A user annotation (``record_function`` range), by the profiler's own flag where this
    torch has it, else by the names torch itself gives them."""
    flag = getattr(event, "is_user_annotation", None)
    if flag is not None:
        return bool(flag)
    return str(event.name).startswith(("ProfilerStep#", "Optimizer.step#", "Optimizer.zero_grad#"))


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by possibly overlapping intervals (kernels on several streams)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
