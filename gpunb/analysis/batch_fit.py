"""Find the largest batch that fits: probe, fit a line, scout if it cannot be trusted, predict, verify.

Peak memory of a training step is close to a line in the batch size: a fixed part
(weights, gradients, optimizer state, workspaces) plus activations per sample
(research/perf-reliability-anchors.md §4.2). More exactly it is the largest of a few such
lines (a convex curve): at small batches the gradients or the optimizer step can set the
peak, the activations only at large ones. So:

1. run the user's step at two small batch sizes (``start`` and ``8 * start``), each trial
   running ``steps`` steps and measuring the last one (``reset_peak_memory_stats`` then
   ``max_memory_allocated`` / ``max_memory_reserved``; NVML adds memory outside torch);
2. fit a line through the two largest successful trials on peak *allocated* memory (exact
   to 512 B even at tiny batches) and solve it for the capacity (free + torch's cache, or
   the ``set_per_process_memory_fraction`` cap). A line on peak *reserved* memory is fitted
   and reported too;
3. if the line cannot be trusted that far (growth within allocator rounding, or the upper
   bound on the growth per sample, (peak - memory at the step's start) / batch, disagrees
   with it), scout: run a batch that the line says uses 1/8 of what is left (an 8x
   underestimate still fits), and refit;
4. run the prediction, ``1 - tolerance`` of the estimate: if it runs, it is within tolerance.
   If it fails where the bound agreed with the line, the allocator needed more room near the
   limit: back off once by the tolerance; any other failure is bisected between the best
   success and the failure, geometrically when they are far apart.

An OOM in a trial is caught (the error's frames are cleared, ``gc.collect()``,
``empty_cache()``), recorded as an upper bound and the search continues. Only CUDA
out-of-memory errors are caught: any other error in the step is the user's and is raised.
The search policy is a pure function of the trials (:func:`next_trial`), tested on
synthetic readings; the measuring runs only on a CUDA device.
"""

from __future__ import annotations

import gc
import math
import sys
import time
import traceback
from typing import Any, Callable

from gpunb.analysis.batch_fit_records import BatchFit, Line, Trial
from gpunb.analysis.oom_message import find_oom

GiB = 2**30


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


def _ok_trials(trials: list[Trial]) -> list[Trial]:
    """Successful trials by batch, one per batch (the last)."""
    by_batch = {t.batch: t for t in trials if t.ok and t.peak_allocated_bytes is not None}
    return [by_batch[b] for b in sorted(by_batch)]


def _use_before_step(ok: list[Trial]) -> bool:
    return bool(ok) and all(t.peak_before_step_bytes is not None for t in ok)


def fit_value(t: Trial, before_step: bool) -> float:
    """The memory that grows with the batch: forward+backward peak when the optimizer hook saw
    it (the optimizer step's own peak is batch-independent and can hide it at small batches),
    else the whole step's peak."""
    return float(t.peak_before_step_bytes if before_step else t.peak_allocated_bytes)


def lines_from(trials: list[Trial]) -> tuple[Line | None, Line | None]:
    """(reserved-bytes, allocated-bytes) lines through the two largest successful trials."""
    ok = _ok_trials(trials)
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
SCOUT_FRACTION = 1 / 8  # a scout uses this much of the capacity left, by the line: an 8x underestimate still fits


def _bound_batch(t: Trial, capacity: int, before: bool) -> float | None:
    """The batch that fits if every part of the step is a line whose intercept is at least the memory
    the step started with (weights, optimizer state): its growth per sample is at most
    (peak - base) / batch, at any batch (research: peak = max of such lines, a convex curve)."""
    if t.base_allocated_bytes is None or fit_value(t, before) <= t.base_allocated_bytes:
        return None
    per_sample_max = (fit_value(t, before) - t.base_allocated_bytes) / t.batch
    return (capacity - t.base_allocated_bytes) / per_sample_max


def _trusted(ok: list[Trial], estimate: float, capacity: int, before: bool, tolerance: float) -> bool:
    """Can the line through the two largest successful trials be extrapolated to ``estimate``?
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
    if bound is not None and bound >= (1 - tolerance) * estimate:
        return True
    near = estimate - b.batch <= EXTRAPOLATE * (b.batch - a.batch)
    if len(ok) >= 3:  # three points on one line: straight, not bending up
        z = ok[-3]
        slope = lambda p, q: (fit_value(q, before) - fit_value(p, before)) / (q.batch - p.batch)  # noqa: E731
        return near and abs(slope(a, b) - slope(z, a)) <= tolerance * slope(a, b)
    return near and bound is None  # two points: only without a bound that disagrees


def next_trial(trials: list[Trial], *, capacity: int, start: int, max_batch: int | None,
               tolerance: float = 0.05, max_trials: int = 6) -> tuple[int, str] | None:
    """The next batch size to try and why, or ``None`` when the search is done."""
    if len(trials) >= max_trials:
        return None
    if not trials:
        return start, "probe"
    ok = sorted((t.batch for t in trials if t.ok))
    fails = sorted(t.batch for t in trials if not t.ok)
    hi = fails[0] if fails else None
    if not ok:
        if hi is None or hi <= 1:
            return None  # even batch 1 does not fit
        return max(1, hi // 2), "smaller start"
    lo = ok[-1]
    upper = math.inf
    if max_batch is not None:
        upper = max_batch
    if hi is not None:
        upper = min(upper, hi - 1)
    if lo >= upper:
        return None
    if len(set(ok)) == 1:
        b = lo * 8 if hi is None else int(math.sqrt(lo * hi))
        b = int(min(b, upper))
        return (b, "probe") if b > lo else None
    cons, opt = lines_from(trials)
    ok_t = _ok_trials(trials)
    before = _use_before_step(ok_t)
    a, b = ok_t[-2], ok_t[-1]
    if hi is None and (_flat(a, b, before) or (len(ok_t) >= 3 and _flat(ok_t[-3], a, before))):
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
    # The allocated-bytes line is exact to 512 B even at tiny batches; the reserved line moves
    # in 2/20 MiB segment steps there, so the estimate comes from the allocated line, and the
    # allocator's overhead near the limit is found by running, not by guessing.
    line_estimate = opt.largest_batch(capacity) if opt else math.inf
    if math.isinf(min(upper, line_estimate)):  # memory does not grow with the batch: keep growing
        return int(min(lo * 4, upper)), "probe"
    untrusted = opt is not None and opt.slope > 0 and not _trusted(ok_t, line_estimate, capacity, before, tolerance)
    if untrusted and (hi is None or trials[-1].ok):
        # Scout: a batch that uses a modest part of what is left by the line, so that even a
        # several-fold underestimate still fits (after a failure: the geometric middle); and at
        # least what the per-sample bound says fits.
        scout = (b.batch + SCOUT_FRACTION * (capacity - fit_value(b, before)) / opt.slope if hi is None
                 else math.isqrt(lo * hi))
        bound = _bound_batch(b, capacity, before)
        if bound is not None:
            scout = max(scout, math.ceil(math.floor(bound) * (1 - tolerance)))  # as the goal below rounds
        scout = int(min(scout, upper))
        if scout > lo * (1 + tolerance):
            return scout, "scout"
    estimate = math.floor(min(upper, line_estimate))
    if max_batch is not None and estimate == max_batch:
        goal = max_batch  # the cap is under the line: try the cap itself
    else:
        # within tolerance of the estimate by construction: the line through growing probes
        # overestimates the largest batch (convex peak, allocator overhead), so this is >= 95 %
        # of the true maximum if it runs, and it fails only if the overhead is above ~5 %
        goal = math.ceil(estimate * (1 - tolerance))
    if lo >= goal:
        return None  # the largest batch that ran is within tolerance of the best estimate
    if (hi is None or not untrusted) and not any(t.purpose == "prediction" for t in trials):
        return max(lo + 1, goal), "prediction"
    # A failure is an upper bound. When the prediction failed though the per-sample bound
    # confirmed the line, the allocator needed more room near the limit than the tolerance: once,
    # just under it. Otherwise the line was wrong (a bend beyond the probes): bisect between the
    # best success and the failure, geometrically when far apart.
    bound = _bound_batch(b, capacity, before)
    if not trials[-1].ok and trials[-1].purpose == "prediction" and (
            bound is None or bound >= (1 - tolerance) * min(line_estimate, trials[-1].batch)):
        return max(lo + 1, goal), "back off"
    if hi is None:  # the prediction ran and the line, refitted through it, reaches further
        return max(lo + 1, goal), "refine"
    mid = math.isqrt(lo * hi) if hi > 4 * lo else (lo + hi) // 2
    return max(lo + 1, min(mid, upper)), "bisect"


def search(run: Callable[[int, str, int], Trial], *, capacity: int, start: int, max_batch: int | None,
           margin: float, tolerance: float = 0.05, max_trials: int = 6,
           progress: Callable[[str], None] | None = None) -> BatchFit:
    """Drive :func:`next_trial` with a ``run(batch, purpose, index) -> Trial`` measurer."""
    trials: list[Trial] = []
    predicted = predicted_reserved = None

    def predictions() -> tuple[int | None, int | None]:
        cons, opt = lines_from(trials)
        if cons is None:
            return None, None
        pc, po = cons.largest_batch(capacity), opt.largest_batch(capacity) if opt else math.inf
        return (None if math.isinf(po) else max(0, math.floor(po))), (None if math.isinf(pc) else max(0, math.floor(pc)))

    while True:
        step = next_trial(trials, capacity=capacity, start=start, max_batch=max_batch,
                          tolerance=tolerance, max_trials=max_trials)
        if step is None:
            break
        batch, purpose = step
        if purpose == "prediction" and predicted is None:  # the lines the prediction was made from
            predicted, predicted_reserved = predictions()
        if progress:
            progress(f"trial {len(trials) + 1}: batch {batch} ({purpose})…")
        trial = run(batch, purpose, len(trials) + 1)
        trials.append(trial)
        if progress:
            progress(f"trial {trial.index}: batch {batch} " + (
                f"ran, peak {trial.peak_allocated_bytes / GiB:.2f} GiB allocated, "
                f"{(trial.peak_reserved_bytes or 0) / GiB:.2f} GiB reserved" if trial.ok else "out of memory"))
    if predicted is None and predicted_reserved is None:  # no prediction was run: the final lines
        predicted, predicted_reserved = predictions()
    ok = [t for t in trials if t.ok]
    cons, opt = lines_from(trials)
    result = BatchFit(ok=bool(ok), margin=margin, trials=tuple(trials), capacity_bytes=capacity,
                      predicted=predicted, predicted_reserved=predicted_reserved, line_reserved=cons, line_allocated=opt)
    if not ok:
        result.problem = ("even the smallest batch tried ran out of memory "
                          f"(batch {min(t.batch for t in trials)}); free memory first (%gpumem) or shrink the model."
                          if trials else "no trial ran.")
        return result
    best = max(t.batch for t in ok)
    result.max_batch = best
    result.recommended = max(1, math.floor(best * (1 - margin)))
    if max_batch is not None and best >= max_batch:
        result.notes.append(f"stopped at max_batch={max_batch}: larger batches were not tried")
    if cons is not None and cons.slope <= 0:
        result.notes.append("peak memory did not grow with the batch size: does step_fn use its batch-size argument?")
    return result


# -- measuring on a CUDA device --------------------------------------------------------------

def _free_after_oom(exc: BaseException, torch: Any) -> None:
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
    gc.collect()
    torch.cuda.empty_cache()


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


def fit_batch_size(
    step_fn: Callable[[int], Any],
    *,
    start: int = 2,
    max_batch: int | None = None,
    margin: float = 0.05,
    device: Any = None,
    steps: int = 2,
    tolerance: float = 0.05,
    max_trials: int = 6,
    progress: Callable[[str], None] | None = None,
) -> BatchFit:
    """The largest batch size ``step_fn(batch_size)`` runs with on this GPU (``%gpufit``).

    ``step_fn`` runs one full training step (forward, backward, optimizer step) at the
    given batch size. Each trial runs it ``steps`` times and measures the last (the first
    step creates optimizer state). ``recommended`` keeps ``margin`` (5 %) below the
    largest batch that ran, for fragmentation over a long run and varying inputs.
    ``progress`` is called with a line of text as each trial starts and ends. Note: this
    resets torch's peak-memory counters of the device.
    """
    if not callable(step_fn):
        return BatchFit(False, f"step_fn must be a function taking the batch size, got {type(step_fn).__name__}. "
                               "Define `def step(batch_size): ...` (one training step) and pass `step`.")
    for name, value, low in (("start", start, 1), ("steps", steps, 1), ("max_trials", max_trials, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return BatchFit(False, f"{name} must be a whole number ≥ {low}, got {value!r}.")
    if max_batch is not None and (not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < start):
        return BatchFit(False, f"max_batch must be a whole number ≥ start ({start}), got {max_batch!r}.")
    if not isinstance(margin, (int, float)) or not 0 <= margin < 0.9:
        return BatchFit(False, f"margin must be a fraction between 0 and 0.9 (0.05 = 5 %), got {margin!r}.")
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

    from gpunb.readings.torch_state import per_process_limit_bytes

    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(index)
    reserved0 = torch.cuda.memory_reserved(index)
    capacity = free + reserved0
    limit = per_process_limit_bytes(torch, index, total)
    notes = []
    if limit is not None:
        capacity = min(capacity, limit)
        notes.append(f"capped by set_per_process_memory_fraction at {limit / GiB:.2f} GiB")
    nvml_bytes = _nvml_process_bytes(torch, index)

    try:  # torch >= 2.0; torch.optim's namespace hides the submodule, so import it by name
        from torch.optim.optimizer import register_optimizer_step_pre_hook as register_pre_hook
    except ImportError:
        register_pre_hook = None

    def run(batch: int, purpose: str, n: int) -> Trial:
        gc.collect()
        torch.cuda.empty_cache()
        t0 = time.perf_counter()
        before_step: list[int] = []

        def seen_before_step(*_: Any) -> None:  # the forward+backward peak, before optimizer.step()
            if not before_step:
                before_step.append(int(torch.cuda.max_memory_allocated(index)))

        base = None
        handle = None
        try:
            with torch.cuda.device(index):
                for _ in range(steps - 1):
                    step_fn(batch)
                torch.cuda.synchronize(index)
                base = int(torch.cuda.memory_allocated(index))
                torch.cuda.reset_peak_memory_stats(index)
                if register_pre_hook is not None:  # only while the measured step runs
                    handle = register_pre_hook(seen_before_step)
                try:
                    step_fn(batch)
                finally:
                    if handle is not None:
                        handle.remove()
                torch.cuda.synchronize(index)
        except Exception as exc:  # only OOMs are ours to catch
            if find_oom(exc) is None:
                raise
            message = str(find_oom(exc)).split(". ")[0][:200]
            _free_after_oom(exc, torch)
            del exc
            return Trial(n, batch, False, purpose, seconds=time.perf_counter() - t0, error=message)
        peak_a = int(torch.cuda.max_memory_allocated(index))
        peak_r = int(torch.cuda.max_memory_reserved(index))
        proc = nvml_bytes()
        non_torch = None if proc is None else max(0, proc - int(torch.cuda.memory_reserved(index)))
        return Trial(n, batch, True, purpose, peak_a, peak_r, non_torch, time.perf_counter() - t0,
                     peak_before_step_bytes=before_step[0] if before_step else None, base_allocated_bytes=base)

    result = search(run, capacity=capacity, start=start, max_batch=max_batch, margin=float(margin),
                    tolerance=tolerance, max_trials=max_trials, progress=progress)
    result.device = str(torch.device("cuda", index))
    result.notes[:0] = notes
    gc.collect()
    torch.cuda.empty_cache()
    if progress is not None:
        took = sum(t.seconds for t in result.trials)
        progress(f"done: {result.trial_count} trials in {took:.1f} s; largest batch that ran: {result.max_batch}")
    return result
