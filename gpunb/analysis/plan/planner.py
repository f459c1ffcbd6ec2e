"""``gpunb.plan(step, batch_size, gpus=...)``: the peak GPU memory of a training step, before it runs.

1. The step runs twice on stand-in tensors (:mod:`dry_run`): no GPU memory, no CUDA context,
   nothing trained.
2. The recorded allocations go through the caching allocator's books (:mod:`replay`), with
   cuBLAS's workspaces: the peaks ``max_memory_allocated`` and ``max_memory_reserved`` would show.
3. The answer carries the error band of the calibration (:mod:`calibration`).
4. For each GPU: does the batch fit, and the largest batch that does. Memory is close to a line
   in the batch size, so a second batch (twice the first) gives the line; the batch where the
   line meets the GPU's memory is then planned itself and replayed under that memory (the
   allocator's segments, the optimizer state made in freed activations), stepping down until it
   fits. The memory is shrunk by the worst under-estimate seen in calibration first: the answer
   errs low, never high.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpunb.analysis.fit.user_state import Reachable, find_reachable
from gpunb.analysis.memory.alloc_records import TRACE_ROLES, MemoryTrace
from gpunb.analysis.memory.alloc_sites import user_frames
from gpunb.analysis.plan import calibration
from gpunb.analysis.plan.dry_run import dry_run
from gpunb.analysis.plan.gpus import COMMON, Gpu, gpu_named
from gpunb.analysis.plan.recorder import BACKWARD, FORWARD, OPTIMIZER, PlanError, Recorder
from gpunb.analysis.plan.records import GpuAnswer, StepPlan
from gpunb.analysis.plan.replay import Replayed, fits_under, replay, sites_at_peak

MAX_BATCH = 1 << 22
_TRIES = 8  # plans per GPU while looking for its largest batch
CLOSE = 20  # a largest batch within 1/CLOSE (5 %) of the limit is the answer
CLOSE_ABOVE = 10  # ... and one that fits with the line saying at most 10 % more would (one plan less)

__all__ = ["GpuAnswer", "StepPlan", "largest_under", "last_plan", "plan"]
_LAST: list[StepPlan] = []  # the last plan of this process that answered (%gpufit and the OOM doctor use it)


def last_plan() -> StepPlan | None:
    """The last plan of this process that answered, or None."""
    return _LAST[-1] if _LAST else None


def _step_name(step: Any) -> str:
    name = getattr(step, "__qualname__", None) or getattr(step, "__name__", None) or type(step).__name__
    return str(name).rsplit("<locals>.", 1)[-1]  # a function defined in a function: its own name


def _where(rec: Recorder, r: Replayed, cell_numbers: Mapping[str, int]) -> str:
    a = r.peak_alloc
    if a is None:
        return ""
    frames = rec.sites[a.site] if 0 <= a.site < len(rec.sites) else ()
    mine = user_frames(list(frames), cell_numbers)
    line = mine[0].where if mine else ""
    part = {BACKWARD: f"the backward of `{a.module}`" if a.module else "the backward pass",
            FORWARD: f"the forward of `{a.module}`" if a.module else "the forward pass",
            OPTIMIZER: "the optimizer step"}.get(a.phase, "")
    return ", ".join(x for x in (line, part) if x)


class _Runs:
    """Dry runs by batch size, each made once."""

    def __init__(self, torch: Any, step: Callable[[int], Any], reach: Reachable, cell_numbers: Mapping[str, int]):
        self.torch, self.step, self.reach, self.cell_numbers = torch, step, reach, cell_numbers
        self.runs: dict[int, Recorder] = {}
        self.replays: dict[int, Replayed] = {}

    def rec(self, batch: int) -> Recorder:
        if batch not in self.runs:
            self.runs[batch] = dry_run(self.torch, self.step, batch, self.reach, cell_numbers=self.cell_numbers)
        return self.runs[batch]

    def replayed(self, batch: int) -> Replayed:
        if batch not in self.replays:
            self.replays[batch] = replay(self.rec(batch), workspaces=calibration.WORKSPACES)
        return self.replays[batch]

    def fits(self, batch: int, cap: int) -> bool:
        """Planned to fit; a batch the step cannot run at (BatchNorm at batch 1) counts as not fitting."""
        try:
            return fits_under(self.rec(batch), calibration.WORKSPACES, cap)
        except PlanError:
            return False

    def replayed_or_none(self, batch: int) -> Replayed | None:
        try:
            return self.replayed(batch)
        except PlanError:
            return None


def _effective_cap(gpu: Gpu) -> int:
    return int(gpu.usable_bytes / (1 + calibration.UNDER + calibration.SAFETY))


def largest_batch(runs: _Runs, cap: int, slope: float, start: int,
                  max_batch: int = MAX_BATCH, known: int = 0, slope_down: float | None = None) -> tuple[int, bool]:
    """(the largest batch planned to fit under ``cap``, whether the search closed in on it rather than
    stopping at its limit).

    Each guess is the last planned batch moved along the line (``slope`` bytes per sample) to where
    its allocated peak meets the cap (2 % short of it, going up: near the cap the allocator's segments
    take some room; the reserved peak is no guide, the allocator gives back its cache under a cap);
    it is planned and replayed under the cap: one that fits raises
    the floor, one that does not lowers the ceiling. Within 5 % (or a sample), or fitting with the
    line saying at most 10 % more would, the floor is the answer: a batch that was planned to fit,
    never one that was not."""
    lo, hi = known, max_batch + 1  # lo fits (``known``: it fitted a smaller memory), hi does not
    guess = max(start, known + 1) if known < max_batch else known
    for _ in range(_TRIES):
        fits = runs.fits(guess, cap)
        if fits:
            lo = guess
        else:
            hi = guess
        if hi - lo <= max(1, lo // CLOSE):
            break
        r = runs.replayed_or_none(guess)
        if r is None:  # the step cannot run at this batch: halve towards what is known
            guess = max(lo + 1, (lo + hi) // 2) if lo else max(1, guess // 2)
            continue
        upper = runs.replayed_or_none(hi) if lo > 0 and hi <= max_batch else None
        if upper is not None:  # the secant through the bracket: the line where it matters
            rise = upper.peak_allocated - runs.replayed(lo).peak_allocated
            slope = rise / (hi - lo) if rise > 0 else slope
        # up from a fit, the allocated peak's line (the cache is given back under a cap); down from a
        # failure, the reserved peak's (what the allocator held: the need, with room to spare)
        need, rate = (r.peak_allocated, slope) if fits else (r.peak_reserved, slope_down or slope)
        target = guess + (cap - need) / rate if rate > 0 else math.inf if fits else guess / 2
        if fits:  # the line says how much more would; that close, it is the limit
            if target < lo + max(1, lo // CLOSE_ABOVE):
                hi = min(hi, lo + max(1, lo // CLOSE))
                break
            target -= (target - lo) / CLOSE + target / CLOSE
        elif target >= guess - max(1, guess // CLOSE):  # the line says it fits: the allocator's layout did not
            target = (lo + hi) / 2 if lo else guess / 2
        # (else: the line says by how much it did not fit)
        if lo > 0 and hi <= max_batch:  # bracketed: a guess at an edge moves too little, halve instead
            edge = (hi - lo) / 8
            if not lo + edge < target < hi - edge:
                target = math.sqrt(lo * hi) if hi > 2 * lo else (lo + hi) / 2
        guess = int(min(max(math.floor(target) if math.isfinite(target) else hi - 1, lo + 1), hi - 1))
    return lo, hi <= max_batch


def _top_line(result: StepPlan, runs: _Runs) -> None:
    """The line through the two largest batches planned: the peak is convex in the batch size (at small
    ones the optimizer step can set it), so for a batch beyond them this line is the one to read."""
    points = sorted((b, r.peak_reserved) for b, r in runs.replays.items())
    if len(points) < 2:
        return
    (b1, y1), (b2, y2) = points[-2], points[-1]
    if y2 > y1:
        result.per_sample_reserved_bytes = (y2 - y1) / (b2 - b1)
        result.line_batch, result.line_reserved_bytes = b2, y2


def _notes(torch: Any, rec: Recorder, reach: Reachable) -> list[str]:
    notes = []
    compiled = [m for m in reach.modules if type(m).__name__ == "OptimizedModule"]
    if compiled:
        notes.append("the model is compiled with torch.compile: planned as it runs without compiling (compiled "
                     "kernels usually keep less, so the plan errs high)")
    if rec.varying:
        notes.append(f"the step's shapes change from call to call: {rec.varying} calls planned, the peak is the "
                     "largest; a call longer than those needs more")
    if rec.items_read:
        notes.append(f"the step read {rec.items_read} value(s) from tensors (.item(), float(), a comparison); "
                     "stand-ins have no values, so 1 was used: a step whose shapes follow such a value is not "
                     "planned right")
    if rec.device_rewrite is not None:
        kinds = {type(m).__name__ for r in reach.modules for m in r.modules()}
        if kinds & {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d"}:
            notes.append("dropout keeps a 1-byte mask per element on a GPU and a full-size one on the CPU the "
                         "plan ran on: counted as the CPU's (errs high)")
    if rec.benchmark_bytes:
        notes.append("torch.backends.cudnn.benchmark is on: cuDNN takes the fastest algorithm whatever its "
                     "workspace; planned as the largest convolution output through the backward pass (as measured "
                     "on an H200), another GPU may pick otherwise")
    return notes


def _trace(plan: StepPlan, rec: Recorder, r: Replayed, cell_numbers: Mapping[str, int]) -> MemoryTrace:
    return MemoryTrace(
        label=f"the plan of {plan.step_name}({plan.batch_size})", events=r.events, baseline_bytes=r.before_bytes,
        end_bytes=r.end_allocated, peak_bytes=r.peak_allocated, peak_t=float(r.peak_index),
        peak_by_role={k: r.by_role.get(k, 0) for k in TRACE_ROLES},
        sites_at_peak=sites_at_peak(rec, r, cell_numbers), points=r.points, time_unit="event",
        notes=["planned on stand-in tensors, not measured: the timeline is the order of the planned allocations"])


def _reach(torch: Any, step: Any, model: Any, optimizer: Any) -> Reachable:
    reach = find_reachable(torch, step)
    for extra, kind in ((model, "modules"), (optimizer, "optimizers")):
        for obj in extra if isinstance(extra, (list, tuple)) else ([extra] if extra is not None else []):
            if all(o is not obj for o in getattr(reach, kind)):
                getattr(reach, kind).append(obj)
    return reach


def plan(step: Callable[[int], Any], batch_size: int, gpus: Sequence[str | float] | None = None, *,
         model: Any = None, optimizer: Any = None, max_batch: int = MAX_BATCH,
         cell_numbers: Mapping[str, int] | None = None, gpu_list: Sequence[Gpu] | None = None) -> StepPlan:
    """Plan ``step(batch_size)``'s peak GPU memory on this machine, with or without a GPU.

    ``gpus``: GPU names (``"T4"``, ``"A100 80 GB"``) or sizes in GiB (``24``); default: a few
    common ones. ``model`` / ``optimizer``: when the step reaches them in a way gpunb does not
    find. Returns a :class:`StepPlan`; a step that cannot be planned gives one with ``problem``.
    """
    t0 = time.perf_counter()
    whole = isinstance(batch_size, int) and not isinstance(batch_size, bool)
    result = StepPlan(step_name=_step_name(step), batch_size=batch_size if whole else 0,
                      calibrated_on=calibration.CALIBRATED_ON, band_under=calibration.UNDER,
                      band_over=calibration.OVER, context_bytes=calibration.CONTEXT_BYTES)
    if not callable(step):
        result.problem = (f"the step must be a function of the batch size, got {type(step).__name__}: define "
                          "`def step(batch_size): ...` (one training step) and pass `step`")
        return result
    if not whole or batch_size < 1:
        result.problem = f"the batch size must be a whole number of 1 or more, got {batch_size!r}"
        return result
    targets = list(gpu_list or []) + [gpu_named(g) for g in (gpus or ())]
    if not targets:
        targets = [gpu_named(g) for g in COMMON]
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            result.problem = "torch is not installed here: pip install torch (a CPU build is enough to plan)"
            return result
    cell_numbers = dict(cell_numbers or {})
    reach = _reach(torch, step, model, optimizer)
    if not reach.modules:
        result.problem = ("gpunb found no model (torch.nn.Module) from the step: pass it, "
                          "gpunb.plan(step, batch, model=model)")
        return result
    runs = _Runs(torch, step, reach, cell_numbers)
    try:
        rec = runs.rec(int(batch_size))
        r = runs.replayed(int(batch_size))
        result.planned_on = str(next((p.device for m in reach.modules for p in m.parameters()), "cpu"))
        result.peak_bytes, result.peak_reserved_bytes = r.peak_allocated, r.peak_reserved
        result.first_step_peak_bytes, result.steady_peak_bytes = r.first_allocated, r.steady_allocated
        result.before_bytes = r.before_bytes
        result.peak_by_role = {k: r.by_role.get(k, 0) for k in TRACE_ROLES}
        result.peak_where = _where(rec, r, cell_numbers)
        result.trace = _trace(result, rec, r, cell_numbers)
        result.notes = _notes(torch, rec, reach)
        other = 2 * int(batch_size)
        r2 = runs.replayed(other)
        slope = (r2.peak_reserved - r.peak_reserved) / (other - int(batch_size))
        result.per_sample_reserved_bytes = slope if slope > 0 else None
        result.per_sample_bytes = (r2.peak_allocated - r.peak_allocated) / (other - int(batch_size))
        result.batches_planned = (int(batch_size), other)
        answers: dict[int, GpuAnswer] = {}
        best = 0
        for i in sorted(range(len(targets)), key=lambda j: targets[j].usable_bytes):  # what fits less fits more
            gpu = targets[i]
            cap = _effective_cap(gpu)
            spare = gpu.usable_bytes - int(r.peak_reserved * (1 + calibration.UNDER))
            fits = runs.fits(int(batch_size), cap)
            best, exact = largest_batch(runs, cap, result.per_sample_bytes or 0.0, int(batch_size), max_batch,
                                        known=best, slope_down=result.per_sample_reserved_bytes)
            answers[i] = GpuAnswer(gpu.name, gpu.usable_bytes, gpu.total_bytes, gpu.source, fits, spare, best, exact)
        result.gpus = tuple(answers[i] for i in range(len(targets)))
        result.batches_planned = tuple(sorted(runs.runs))
        _top_line(result, runs)
    except PlanError as err:
        result.problem = str(err)
    except KeyboardInterrupt:
        result.problem = "the plan was interrupted; your model, optimizer and random generators are as they were"
    result.seconds = time.perf_counter() - t0
    if result.ok:
        _LAST[:] = [result]
    return result


def largest_under(step: Callable[[int], Any], capacity_bytes: int, start: int = 8) -> int | None:
    """The largest batch planned to fit ``capacity_bytes`` of torch's allocator (``%gpufit`` starts its
    search there); None when the step cannot be planned."""
    from gpunb.analysis.plan.gpus import with_cap

    result = plan(step, max(1, start), gpu_list=[with_cap("this GPU", capacity_bytes)])
    if not result.ok or not result.gpus:
        return None
    return result.gpus[0].largest_batch or None
