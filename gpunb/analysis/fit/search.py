"""Find the largest batch that trains: probe, fit lines, scout, then bracket the limit.

Over 500 lines on purpose: it is the one search, read top to bottom; a trial, the fresh start and
the user's state it restores are in ``trial``, ``fresh_state`` and ``user_state``.

"Fits" means what a user means: the batch trains a sustained run (``steps`` steps, 50 by
default) without an out-of-memory error, in this process and in a fresh one. Every trial
is such a run (:mod:`gpunb.analysis.fit.trial`), started as a fresh process starts
(:mod:`gpunb.analysis.fit.fresh_state`): whether it trained is what a fresh process would see.

Peak memory of a training step is close to a line in the batch size: a fixed part
(weights, gradients, optimizer state, workspaces) plus activations per sample
(research/perf-reliability-anchors.md §4.2). More exactly it is the largest of a few such
lines (a convex curve): at small batches the gradients or the optimizer step can set the
peak, the activations only at large ones. So:

1. run the step at two small batch sizes (``start`` and ``8 * start``) and fit a line to
   the peak *allocated* bytes (exact to 512 B even at tiny batches);
2. scout: a batch the line says fills a third of the capacity (an eighth when the line
   cannot be trusted that far: growth within allocator rounding, or an upper bound on the
   growth per sample that disagrees), so that the allocator's overhead at large blocks
   shows in the peak *reserved* bytes;
3. first candidate: where the allocated line, scaled by that overhead, reaches the capacity,
   kept within 85-92 % of where the tensors alone would fill it (the overhead at a third of
   the memory is not always the overhead at the limit: the optimizer state of a fresh process
   pins a few large blocks, cuDNN workspaces and variable lengths fill whatever cache there is);
4. then close in: above a batch that trained, half way to where the tensors fill the memory
   (at most 5 % further in the last trial); while nothing has failed, from the line's end (or,
   in the last trial, once what trained already gives 90 % of it) 7.8 % beyond it: a peak can
   give way near the limit (cuDNN runs a plan with a smaller workspace), so only a batch that
   did not train marks the limit;
   below one that did not, step down from it (first to the overhead-scaled line if that is
   lower, but at most 12 % below the failure; in the last trial to at most 85 % of that line),
   then bisect, until the two are 2 % apart or 6 trials ran.

The recommendation is 3 % below the largest batch that trained, below every batch that did
not, when that batch is at the limit (fresh processes differ by a sample or two there);
else that batch. An OOM in a trial is caught (its frames cleared, ``gc.collect()``,
``empty_cache()``) and the search continues; any other error in the step is the user's and
is raised. The search policy is a pure function of the trials (:func:`next_trial`), tested
on synthetic readings; the measuring runs on a CUDA device (or a simulated one in tests).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

from gpunb.analysis.fit.fresh_state import FreshStart
from gpunb.analysis.fit.records import BatchFit, Line, Trial
from gpunb.analysis.fit.trial import CudaMemory, DeviceMemory, run_trial
from gpunb.analysis.fit.user_state import UserState
from gpunb.readings.interrupts import deferred_sigint

GiB = 2**30
__all__ = ["BatchFit", "Line", "Trial", "fit_batch_size", "fit_line", "last_fit", "lines_from", "next_trial",
           "search"]


def fit_line(points: list[tuple[int, float]]) -> Line | None:
    """Least-squares line through ``(batch, bytes)``; ``None`` with fewer than two batches."""
    pts = sorted(set(points))
    if len({b for b, _ in pts}) < 2:
        return None
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((b - mb) ** 2 for b, _ in pts)
    slope = sum((b - mb) * (y - my) for b, y in pts) / sxx
    return Line(my - slope * mb, slope)


def _reserved_total(t: Trial, base_non_torch: int | None) -> float:
    extra = 0
    if t.non_torch_bytes is not None and base_non_torch is not None:
        extra = max(0, t.non_torch_bytes - base_non_torch)  # workspaces outside torch that grew
    return float((t.peak_reserved_bytes or t.peak_allocated_bytes or 0) + extra)


def _fitting_trials(trials: list[Trial]) -> list[Trial]:
    """Trials that trained, by batch, one per batch (the last), below every batch that did not."""
    bad = [t.batch for t in trials if not t.fits]
    hi = min(bad) if bad else math.inf
    by_batch = {t.batch: t for t in trials if t.fits and t.peak_allocated_bytes is not None and t.batch < hi}
    return [by_batch[b] for b in sorted(by_batch)]


def _use_before_step(ok: list[Trial]) -> bool:
    return bool(ok) and all(t.peak_before_step_bytes is not None for t in ok)


def fit_value(t: Trial, before_step: bool) -> float:
    """The memory that grows with the batch: forward+backward peak when the optimizer hook saw
    it (the optimizer step's own peak is batch-independent and can hide it at small batches),
    else the whole step's peak."""
    value = t.peak_before_step_bytes if before_step else t.peak_allocated_bytes
    if value is None:  # callers pass fitting trials, which carry the peaks they are asked for
        raise ValueError(f"trial {t.index} (batch {t.batch}) has no peak memory reading")
    return float(value)


def lines_from(trials: list[Trial]) -> tuple[Line | None, Line | None]:
    """(reserved-bytes, allocated-bytes) lines through the two largest trials that trained."""
    ok = _fitting_trials(trials)
    if len(ok) < 2:
        return None, None
    base = next((t.non_torch_bytes for t in ok if t.non_torch_bytes is not None), None)
    top = ok[-2:]
    before = _use_before_step(ok)
    cons = fit_line([(t.batch, _reserved_total(t, base)) for t in top])
    opt = fit_line([(t.batch, fit_value(t, before)) for t in top])
    return cons, opt


def _flat(a: Trial, b: Trial, before: bool) -> bool:
    """b's memory did not grow over a's: the peak is set by something batch-independent.
    Allocations are deterministic, so a flat peak repeats to the byte (a page of slack)."""
    return fit_value(b, before) - fit_value(a, before) <= 4096


ROUNDING = 2 * 2**20  # the allocator's small-pool segment: growth below it says nothing about activations
EXTRAPOLATE = 16  # trust a line up to this many probe spacings beyond the largest probe
SCOUT_FRACTION = 1 / 8  # an untrusted line: a scout uses this much of the capacity left (an 8x underestimate fits)
SIZING_FRACTION = 1 / 3  # a trusted line: the scout fills this much, so the overhead of large blocks shows
# A trial whose peak reserved is under this share of the capacity says little about the
# allocator's overhead near it (20 MiB segments, rounding): scout before the first candidate.
INFORMATIVE = 1 / 8


def _informative(t: Trial, smallest: Trial, capacity: int) -> bool:
    """Did ``t`` fill enough of the room left for activations to show the allocator's overhead
    at large blocks? (Its peak reserved above the memory the steps started with.)"""
    base = t.base_allocated_bytes if t.base_allocated_bytes is not None else smallest.peak_allocated_bytes or 0
    return (t.peak_reserved_bytes or 0) - base >= INFORMATIVE * max(1, capacity - base)


def _bound_batch(t: Trial, capacity: int, before: bool) -> float | None:
    """The batch that fits if every part of the step is a line whose intercept is at least the memory
    the step started with (weights, optimizer state): its growth per sample is at most
    (peak - base) / batch, at any batch (research: peak = max of such lines, a convex curve)."""
    if t.base_allocated_bytes is None or fit_value(t, before) <= t.base_allocated_bytes:
        return None
    per_sample_max = (fit_value(t, before) - t.base_allocated_bytes) / t.batch
    return (capacity - t.base_allocated_bytes) / per_sample_max


def overhead_ratio(t: Trial) -> float:
    """How much more the allocator reserved than it allocated, over what the steps added to the
    memory they started with (split blocks, segment rounding, cached workspaces): >= 1."""
    base = t.base_allocated_bytes or 0
    grown = (t.peak_allocated_bytes or 0) - base
    if grown <= 0 or t.peak_reserved_bytes is None:
        return 1.0
    return max(1.0, (t.peak_reserved_bytes - base) / grown)


def reserved_target(fitting: list[Trial], opt: Line | None, capacity: int) -> float:
    """The batch whose peak reserved memory reaches the capacity: the allocated line (exact, and
    read before optimizer.step where the optimizer sets the peak at small batches), scaled by
    the allocator's overhead measured at the largest trial that trained."""
    if opt is None or opt.slope <= 0:
        return math.inf
    b = fitting[-1]
    base = b.base_allocated_bytes if b.base_allocated_bytes is not None else fitting[0].peak_allocated_bytes or 0
    return opt.largest_batch(base + (capacity - base) / overhead_ratio(b))


def _reserved_bound_batch(t: Trial, capacity: int) -> float | None:
    """:func:`_bound_batch` for the peak *reserved* bytes: the batch that fits if reserved memory
    grows by at most (peak reserved - base) / batch per sample (the allocator's overhead included)."""
    base, peak = t.base_allocated_bytes, t.peak_reserved_bytes
    if base is None or peak is None or peak <= base:
        return None
    return (capacity - base) * t.batch / (peak - base)


def _trusted(ok: list[Trial], estimate: float, capacity: int, before: bool, tolerance: float) -> bool:
    """Can the line through the two largest trials that trained be extrapolated to ``estimate``?
    The peak is a convex curve (at small batches gradients or the optimizer set it, activations
    take over later), so a chord through small batches underestimates the growth at large ones
    (the H200 MLP: 135 KB/sample measured at batch 2-16, 660 KB/sample true). Trusted when the
    upper bound on the growth per sample agrees with the line; else when the line reaches at
    most a few probe spacings beyond the probes and did not bend up between them. Never when the
    growth is within allocator rounding."""
    a, b = ok[-2], ok[-1]
    if fit_value(b, before) - fit_value(a, before) < ROUNDING:
        return False
    bound = _bound_batch(b, capacity, before)
    if bound is not None and bound >= (1 - 2 * tolerance) * estimate:
        return True
    near = estimate - b.batch <= EXTRAPOLATE * (b.batch - a.batch)
    if len(ok) >= 3:  # three points on one line: straight, not bending up
        z = ok[-3]
        def slope(p: Trial, q: Trial) -> float:
            return (fit_value(q, before) - fit_value(p, before)) / (q.batch - p.batch)

        return near and abs(slope(a, b) - slope(z, a)) <= tolerance * slope(a, b)
    return near and bound is None  # two points: only without a bound that disagrees


CANDIDATES = ("candidate", "refine", "beyond", "back off", "bisect")
# The first candidate aims at the overhead-scaled line, kept within this share of the batch
# where the tensors alone would fill the memory. On two H200s (zoo run 1) the largest batch that
# trained in a fresh process was 87-98 % of that batch; the overhead measured at a third of the
# memory predicts it for some models and is far too cautious for others (cuDNN workspaces and
# variable lengths fill whatever cache there is, and give it back when asked).
FIRST_AIM = (0.85, 0.92)
BACK_OFF = 0.06  # a first candidate that did not train: try this much lower, then bisect
# ... or lower, down to the overhead-scaled line, but at most this far below the failure. The
# overhead a scout measures can be cached memory the allocator gives back near the limit: on the
# H200 (fit_margin_diagnosis, bn_convnet under 20 GiB) the scout reserved 13.26 GiB for 7.32 GiB
# allocated (1.81x), the batch at the limit 1.16x, so the overhead-scaled line said 463 where 725
# trained; the first candidate (717, held up by FIRST_AIM's floor) trained by 1 %. Had it missed,
# the back-off would have gone down to 64 % of the limit and the last trial climbed back only to
# ~0.9 of it: 85-88 % after SAFETY, issue 24's 88 % (reproduced on the simulated allocator with
# those numbers, tests/test_batch_fit.py; 91-96 % with this floor).
FIRST_BACK_OFF = 2 * BACK_OFF
# Above a batch that trained: half way to where the tensors fill the memory; in the last trial at
# most this much further (a step that misses gains nothing then; on the H200 a fresh process's
# limit was 87-98 % of where the tensors fill the memory, so from 85 % a 5 % step lands most often).
REFINE = 0.05
PRECISION = 0.02  # stop once the largest batch that trained is this close to one that did not
# The recommendation is this much below the largest batch that trained. Near the limit, fresh
# processes do not order themselves by batch: on the H200 (run 1) bf16_lm trained 50 steps at 55
# and at 57 but not at 56 (the layout of the allocator's blocks depends on the exact sizes), and
# cuDNN's timed choice of algorithms differs between runs. 3 % covers those 1-2 samples.
SAFETY = 0.03
# Beyond the line. The allocated line says where the step's peak would fill the memory, not where
# training stops: part of a peak can give way near the limit. When the workspace of cuDNN's
# preferred plan does not fit, torch catches the out-of-memory error and runs the next plan, with
# a smaller one (aten/src/ATen/native/cudnn/Conv_v8.cpp: try_configs, and a cached plan that no
# longer fits is searched again), so batches past the line's end can train. On the H200 the zoo's
# conv_bn (cudnn.benchmark) shows it: at batch 441 cuDNN caught 2 out-of-memory errors and the
# peak grew 8.2 MiB per sample there, 10.2 below (fit_margin_diagnosis). A search that stops at
# the line's end then recommends 86-91 % on the simulated allocator (a workspace of 5-12 % of the
# per-sample memory that gives way). So while nothing has failed, the search does not stop at the
# line's end: it steps beyond it, as far as a miss still leaves GOAL (what trained, less SAFETY,
# is GOAL of the step's batch); in the last trial too, once what trained already gives GOAL of
# the line's end (there a step towards the line gains 2-3 % at most).
GOAL = 0.90  # the recommendation's aim: this share of the largest batch that trains, at least
BEYOND = (1 - SAFETY) / GOAL - 1  # 7.8 %


def next_trial(trials: list[Trial], *, capacity: int, start: int, max_batch: int | None,
               tolerance: float = 0.05, max_trials: int = 6, planned: int | None = None) -> tuple[int, str] | None:
    """The next batch size to try and why, or ``None`` when the search is done. ``planned``: the
    largest batch ``gpunb.plan`` found for this capacity; the search starts there and one step
    above it (a plan errs low), then goes on as from any two trials."""
    if len(trials) >= max_trials:
        return None
    if planned is not None and planned >= 1 and all(t.purpose in PLANNED for t in trials):
        top = max_batch if max_batch is not None else math.inf
        if not trials:
            return int(min(planned, top)), PLANNED[0]
        if len(trials) == 1 and trials[0].fits and min(planned * (1 + 2 * tolerance), top) > planned:
            return int(min(planned * (1 + 2 * tolerance), top)), PLANNED[1]
    if not trials:
        return start, "probe"
    bad = sorted(t.batch for t in trials if not t.fits)
    hi = bad[0] if bad else None
    fitting = _fitting_trials(trials)
    if not fitting:
        if hi is None or hi <= 1:
            return None  # even batch 1 does not fit
        return max(1, hi // 2), "smaller start"
    lo = fitting[-1].batch
    upper = math.inf
    if max_batch is not None:
        upper = max_batch
    if hi is not None:
        upper = min(upper, hi - 1)
    if lo >= upper:
        return None
    if len(fitting) == 1:
        guess = lo * 8 if hi is None else int(math.sqrt(lo * hi))
        guess = int(min(guess, upper))
        return (guess, "probe") if guess > lo else None
    before = _use_before_step(fitting)
    a, b = fitting[-2], fitting[-1]
    if hi is None and (_flat(a, b, before) or (len(fitting) >= 3 and _flat(fitting[-3], a, before))):
        # Not (or only just) growing with the batch: at small batches something batch-independent
        # (the optimizer step's temporaries, gradients) sets the peak, and a line through a flat
        # point underestimates the growth. The growing part is at most (peak - base) / batch per
        # sample, so this batch fits if the step is linear above the memory it started with:
        safe = lo * 8
        bound = _bound_batch(b, capacity, before)
        if bound is not None:
            # (less the tolerance: the allocator needs some room beyond the tensors near the limit)
            safe = math.floor(bound * (1 - tolerance))
        safe = int(min(safe, upper))
        if safe > lo * (1 + tolerance):
            return safe, "probe (bound)"
    _, opt = lines_from(trials)
    line_estimate = opt.largest_batch(capacity) if opt else math.inf
    # (two fitting batches always give a line: ``opt is None`` only keeps the types honest)
    if opt is None or math.isinf(min(upper, line_estimate)):  # memory does not grow with the batch: keep growing
        return int(min(lo * 4, upper)), "probe"
    informative = _informative(b, fitting[0], capacity)
    trusted = opt is not None and opt.slope > 0 and _trusted(fitting, line_estimate, capacity, before, tolerance)
    if not (informative and trusted) and (hi is None or trials[-1].fits):
        # Scout: a batch that fills a modest part of what is left by the line (a several-fold
        # underestimate still fits), and at least what the per-sample bound says fits.
        fraction = SIZING_FRACTION if trusted else SCOUT_FRACTION
        scout = (b.batch + fraction * (capacity - fit_value(b, before)) / opt.slope if hi is None
                 else math.isqrt(lo * hi))
        if not trusted:
            # The line may underestimate the growth several-fold (a convex peak): stay under what
            # the per-sample bound on allocated memory allows, but go at least as far as the bound
            # on reserved memory says is safe (it counts the allocator's overhead too).
            bound, bound_r = _bound_batch(b, capacity, before), _reserved_bound_batch(b, capacity)
            if bound is not None:
                scout = min(scout, math.floor(bound * (1 - tolerance)))
            if bound_r is not None:
                scout = max(scout, math.floor(bound_r * (1 - tolerance)))
        scout = int(min(scout, upper))
        if scout > lo * (1 + tolerance):
            return scout, "scout"
    return _candidate(trials, fitting, opt, capacity=capacity, lo=lo, hi=hi, upper=upper, max_batch=max_batch,
                      trusted=trusted, max_trials=max_trials)


def _candidate(trials: list[Trial], fitting: list[Trial], opt: Line, *, capacity: int, lo: int, hi: int | None,
               upper: float, max_batch: int | None, trusted: bool, max_trials: int) -> tuple[int, str] | None:
    """Near the limit: every trial is a sustained run from a fresh start, so the batches that
    trained and those that did not bracket the answer; narrow the bracket to PRECISION."""
    full = opt.largest_batch(capacity)  # the peak as measured so far fills the memory here
    target = reserved_target(fitting, opt, capacity)  # where the overhead measured so far says it ends
    if not trusted:  # the line may bend up beyond the trials: stay under the per-sample bound
        bound_r = _reserved_bound_batch(fitting[-1], capacity)
        if bound_r is not None:
            full = min(full, bound_r)
            target = min(target, bound_r)
    tried = [t for t in trials if t.purpose in CANDIDATES]
    if hi is None:
        if max_batch is not None and upper == max_batch and min(target, full) >= max_batch:
            return (max_batch, "candidate") if lo < max_batch else None  # the cap is under the line
        goal, purpose = min(max(target, FIRST_AIM[0] * full), FIRST_AIM[1] * full), "candidate"
        if tried or goal <= lo * (1 + PRECISION):  # a candidate trained (or a scout got this far)
            last = len(trials) == max_trials - 1
            secured = lo * (1 - SAFETY) >= GOAL * full  # GOAL of anything up to the line's end, already
            if lo >= (1 - PRECISION) * full or (last and secured):
                goal, purpose = lo * (1 + BEYOND), "beyond"  # nothing failed: the line is not the limit
            else:
                goal, purpose = (lo + full) / 2, "refine"
                if last:  # the last trial: a step that misses gains nothing
                    goal = min(goal, lo * (1 + REFINE))
            goal = max(lo * (1 + PRECISION), goal)
    else:
        if hi - lo <= max(1, PRECISION * lo):
            return None
        if lo < (1 - 2 * BACK_OFF) * hi:
            # what trained is far below what did not: step down from the failure, a little more
            # each time (a bisection towards a scout would waste the trials near the limit)
            k = 1 + sum(t.purpose == "back off" for t in trials)
            goal = hi * (1 - BACK_OFF * k)
            if k == 1:  # the first aim may have been raised above the measured overhead: go there,
                # but not further than FIRST_BACK_OFF below the failure (and a sample: at small
                # batches that is one or two samples)
                goal = min(goal, max(target * (1 - PRECISION), hi * (1 - FIRST_BACK_OFF) - 1))
            if len(trials) == max_trials - 1:  # the last trial: if it misses, only the scouts trained
                goal = min(goal, FIRST_AIM[0] * full)
            goal, purpose = max(goal, math.sqrt(lo * hi)), "back off"
        else:
            goal, purpose = (lo + hi) / 2, "bisect"
    goal = int(min(math.floor(goal), upper))
    if goal <= lo:
        return None
    return goal, purpose


PLANNED = ("planned", "above the plan")  # the purposes of the trials a plan chose


def search(run: Callable[[int, str, int], Trial], *, capacity: int, start: int, max_batch: int | None,
           margin: float = 0.0, tolerance: float = 0.05, max_trials: int = 6,
           progress: Callable[[str], None] | None = None, planned: int | None = None) -> BatchFit:
    """Drive :func:`next_trial` with a ``run(batch, purpose, index) -> Trial`` measurer.
    ``capacity`` is what the step may use (already less any margin)."""
    trials: list[Trial] = []
    predicted = predicted_reserved = None
    t0 = time.perf_counter()

    def predictions() -> tuple[int | None, int | None]:
        _, opt = lines_from(trials)
        if opt is None:
            return None, None
        po, pr = opt.largest_batch(capacity), reserved_target(_fitting_trials(trials), opt, capacity)
        return ((None if math.isinf(po) else max(0, math.floor(po))),
                (None if math.isinf(pr) else max(0, math.floor(pr))))

    while True:
        step = next_trial(trials, capacity=capacity, start=start, max_batch=max_batch,
                          tolerance=tolerance, max_trials=max_trials, planned=planned)
        if step is None:
            break
        batch, purpose = step
        if purpose == "candidate" and predicted is None:  # the lines the first candidate was chosen from
            predicted, predicted_reserved = predictions()
        if progress:
            progress(f"trial {len(trials) + 1}: batch {batch} ({purpose})…")
        trial = run(batch, purpose, len(trials) + 1)
        trials.append(trial)
        if progress:
            progress(f"trial {trial.index}: batch {batch} {trial.verdict}" + (
                f", peak {(trial.peak_allocated_bytes or 0) / GiB:.2f} GiB allocated, "
                f"{(trial.peak_reserved_bytes or 0) / GiB:.2f} GiB reserved of {capacity / GiB:.2f} GiB"
                if trial.fits else "") + f" ({trial.seconds:.1f} s)")
    if predicted is None and predicted_reserved is None:  # no candidate was run: the final lines
        predicted, predicted_reserved = predictions()
    cons, opt = lines_from(trials)
    result = BatchFit(ok=False, margin=margin, trials=tuple(trials), capacity_bytes=capacity,
                      predicted=predicted, predicted_reserved=predicted_reserved, line_reserved=cons,
                      line_allocated=opt, seconds=time.perf_counter() - t0,
                      steps=max((t.steps for t in trials), default=0))
    fitting = _fitting_trials(trials)
    if not fitting:
        smallest = min((t.batch for t in trials), default=None)
        result.problem = ("no trial ran." if smallest is None else
                          f"even the smallest batch tried ran out of memory (batch {smallest}); free memory first "
                          "(%gpumem) or shrink the model.")
        return result
    result.ok = True
    verified = fitting[-1]
    result.verified = verified.batch
    failed = [t.batch for t in trials if not t.fits and t.batch > verified.batch]
    full = opt.largest_batch(capacity) if opt is not None else math.inf
    if max_batch is not None and verified.batch >= max_batch:
        result.recommended = verified.batch
        result.notes.append(f"stopped at max_batch={max_batch}: larger batches were not tried")
    elif failed or verified.batch >= FIRST_AIM[0] * full:
        # at the limit: keep the margin that covers how fresh processes differ there
        result.recommended = max(1, math.floor(verified.batch * (1 - SAFETY)))
        result.safety = SAFETY if result.recommended < verified.batch else 0.0
    else:
        result.recommended = verified.batch
        if len(trials) >= max_trials and not math.isinf(full):
            result.notes.append(f"the search used all {max_trials} trials below the limit (the line said "
                                f"≈{math.floor(full)} fills the memory): --max-trials {max_trials + 2} searches "
                                "further")
    past = [t for t in fitting if t.purpose == "beyond" and predicted is not None and t.batch > predicted]
    if past:
        result.notes.append(f"batch {past[-1].batch} trained although the memory line said {predicted} fills the "
                            "memory: part of the peak gives way near the limit (cuDNN runs algorithms with smaller "
                            "workspaces)")
    if cons is not None and cons.slope <= 0:
        result.notes.append("peak memory did not grow with the batch size: does step_fn use its batch-size argument?")
    if verified.at_edge:
        result.notes.append(f"batch {verified.batch} trained although {verified.verdict.removeprefix('fits (')[:-1]}: "
                            "a fresh process does the same, but the memory is nearly full")
    return result


# -- measuring on a device ---------------------------------------------------------------------

_LAST: list[BatchFit] = []  # the last successful fit of this process (the OOM doctor quotes it)


def last_fit() -> BatchFit | None:
    """The last successful :func:`fit_batch_size` result in this process, if any."""
    return _LAST[-1] if _LAST else None


def fit_with_memory(step_fn: Callable[[int], Any], memory: DeviceMemory, *, capacity: int, start: int = 2,
                    max_batch: int | None = None, margin: float = 0.0, steps: int = 50, tolerance: float = 0.05,
                    max_trials: int = 6, progress: Callable[[str], None] | None = None,
                    nvml_bytes: Callable[[], int | None] | None = None,
                    host_available: Callable[[], int | None] | None = None,
                    planner: Callable[[int], int | None] | None = None) -> BatchFit:
    """The search on any :class:`~gpunb.analysis.fit.trial.DeviceMemory` (a CUDA device, or the
    simulated one of the CPU tests and of ``benchmarks/batch_fit_zoo.py --smoke``). Each trial
    starts as a fresh process would; the optimizers' own state is put back at the end.
    ``planner(capacity)``: the largest batch a plan says fits (``gpunb.plan``), where the search starts."""
    usable = int(capacity * (1 - margin))
    planned = _ask(planner, usable)
    fresh = FreshStart(memory.torch, host_available or (lambda: None), memory.device)
    # before anything runs: the model, its optimizers, schedulers, scalers, RNGs and modes as they are
    saved = UserState.capture(memory.torch, step_fn, host_available=host_available or (lambda: None))

    def run(batch: int, purpose: str, n: int) -> Trial:
        return run_trial(step_fn, batch, memory=memory, steps=steps, index=n, purpose=purpose, capacity=usable,
                         fresh=fresh, nvml_bytes=nvml_bytes)

    try:
        result = search(run, capacity=usable, start=start, max_batch=max_batch, margin=margin, tolerance=tolerance,
                        max_trials=max_trials, progress=progress, planned=planned)
    finally:
        # after a normal fit, an error in the step or a Ctrl-C: every saved thing goes back, a
        # second Ctrl-C waits until it has (both restores hold SIGINT back)
        with deferred_sigint():
            try:
                fresh.restore(memory.settle)
            finally:
                saved.restore()  # the pre-fit snapshot wins over the optimizer state FreshStart kept
                memory.settle()
    result.step_name = getattr(step_fn, "__qualname__", None) or type(step_fn).__qualname__
    result.notes.extend(fresh.kept)
    result.notes.extend(saved.notes)
    if margin:
        result.notes.append(f"{margin * 100:.0f} % of {capacity / GiB:.2f} GiB kept free (--margin)")
    if planned:
        result.notes.append(f"started at batch {planned}, the largest a plan of the step said fits (gpunb.plan)")
    if result.ok:
        _LAST[:] = [result]
    return result


def _ask(planner: Callable[[int], int | None] | None, capacity: int) -> int | None:
    """The planned batch, or None: a plan that fails only means the usual start."""
    if planner is None:
        return None
    try:
        planned = planner(capacity)
    except Exception:  # noqa: BLE001 (the search does not need it)
        return None
    return planned if isinstance(planned, int) and planned >= 1 else None


def fit_batch_size(
    step_fn: Callable[[int], Any],
    *,
    start: int = 2,
    max_batch: int | None = None,
    margin: float = 0.0,
    device: Any = None,
    steps: int = 50,
    tolerance: float = 0.05,
    max_trials: int = 6,
    progress: Callable[[str], None] | None = None,
    planner: Callable[[int], int | None] | None = None,
) -> BatchFit:
    """The largest batch size ``step_fn(batch_size)`` trains with on this GPU (``%gpufit``).

    ``step_fn`` runs one full training step (forward, backward, optimizer step) at the
    given batch size. Each trial is a sustained run of ``steps`` steps that starts as a fresh
    process would (the optimizers' state and gradients emptied, the cache given back);
    ``verified`` is the largest batch whose run trained, ``recommended`` that less 3 % when it
    was at the limit (fresh processes differ by a sample or two there). ``margin`` keeps that
    fraction of the memory free on top (for inputs larger than the step's, or other
    programs). The trials train the model: they run real optimizer steps; the optimizers'
    own state is set aside on the host and put back afterwards. ``progress`` is called with a
    line of text as each trial starts and ends. ``planner(capacity)`` gives the batch to start
    at (the shell passes ``gpunb.plan``'s largest batch). Note: this resets torch's peak-memory
    counters of the device.
    """
    if not callable(step_fn):
        return BatchFit(False, f"step_fn must be a function taking the batch size, got {type(step_fn).__name__}. "
                               "Define `def step(batch_size): ...` (one training step) and pass `step`.")
    for name, value, low in (("start", start, 1), ("steps", steps, 1), ("max_trials", max_trials, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return BatchFit(False, f"{name} must be a whole number ≥ {low}, got {value!r}.")
    if max_batch is not None and (not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < start):
        return BatchFit(False, f"max_batch must be a whole number ≥ start ({start}), got {max_batch!r}.")
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin < 0.9:
        return BatchFit(False, f"margin must be a fraction between 0 and 0.9 (0.05 = keep 5 % free), got {margin!r}.")
    torch = sys.modules.get("torch")
    if torch is None:
        return BatchFit(False, "torch is not imported: %gpufit runs your PyTorch training step. "
                               "`import torch`, define the step, then run it again.")
    if not torch.cuda.is_available():
        return BatchFit(False, "fitting a batch size needs a CUDA GPU, and torch sees none here "
                               f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                               "Run %gpucheck to see why; on a CPU-only machine there is nothing to fit.")
    try:
        dev = torch.device(device if device is not None else "cuda")
    except Exception as exc:
        return BatchFit(False, f"device {device!r} is not a torch device ({exc}); use e.g. 'cuda:0'.")
    if dev.type != "cuda":
        return BatchFit(False, f"device must be a CUDA device, got {dev}.")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return BatchFit(False, f"cuda:{index} does not exist: torch sees {torch.cuda.device_count()} GPU(s).")

    from gpunb.readings.host import ram_available_bytes
    from gpunb.readings.torch_state import per_process_limit_bytes

    memory = CudaMemory(torch, index)
    memory.settle()
    free, total = torch.cuda.mem_get_info(index)
    capacity = free + torch.cuda.memory_reserved(index)
    limit = per_process_limit_bytes(torch, index, total)
    notes = []
    if limit is not None:
        capacity = min(capacity, limit)
        notes.append(f"capped by set_per_process_memory_fraction at {limit / GiB:.2f} GiB")
    say = progress
    with torch.cuda.device(index):
        result = fit_with_memory(step_fn, memory, capacity=capacity, start=start, max_batch=max_batch,
                                 margin=float(margin), steps=steps, tolerance=tolerance, max_trials=max_trials,
                                 progress=say, nvml_bytes=_nvml_process_bytes(torch, index),
                                 host_available=ram_available_bytes, planner=planner)
    result.device = str(torch.device("cuda", index))
    result.notes[:0] = notes
    if say is not None:
        say(f"done: {result.trial_count} trials of {steps} steps in {result.seconds:.1f} s; "
            f"recommended batch: {result.recommended}")
    return result


def _nvml_process_bytes(torch: Any, device: int) -> Callable[[], int | None]:
    """This process's memory on ``cuda:device`` as NVML sees it (devices.py: by PID, or by
    torch's reserve inside a container); None when NVML cannot say."""
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.nvml import default_session

    nvml = default_session()
    if not nvml.start().ok:
        return lambda: None
    device_map = read_device_map(nvml, torch=torch)
    index = device_map.nvml_index(device)
    if index is None:
        return lambda: None
    return lambda: read_ownership(nvml, index, torch=torch, device_map=device_map, names=False).self_bytes
