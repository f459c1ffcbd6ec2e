"""Code that runs inside the real kernels of test_oom_gpu.py (imported there, not collected by pytest).

Baselines for %gpufit, on the same step function:
- brute force: the true largest batch, by bisection with real OOMs;
- Lightning ``BatchSizeFinder(mode="power")``: documented sequence reimplemented here
  (init_val=2, double after each success, on the first OOM halve once and stop;
  steps_per_trial=3). Source: Lightning `src/lightning/pytorch/tuner/batch_size_scaling.py`
  `_run_power_scaling`, summarised in research/perf-reliability-anchors.md §4.1. Newer
  Lightning caps at max_val=8192 (PR #21163); the count here is without that cap.
- accelerate ``find_executable_batch_size``: the real decorator from accelerate
  (halve on OOM from ``starting_batch_size``), started at the power of two above twice the
  true maximum, so it has room to search.
"""

from __future__ import annotations

import gc
import math
import time
import traceback

import torch


def runs(step, batch: int, steps: int = 2) -> bool:
    """Does ``step(batch)`` run ``steps`` times without a CUDA OOM? Frees everything after."""
    gc.collect()
    torch.cuda.empty_cache()
    try:
        for _ in range(steps):
            step(batch)
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError as exc:
        traceback.clear_frames(exc.__traceback__)
        return False
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def true_max(step, known_ok: int, steps: int = 2) -> dict:
    """Largest batch that runs, by real OOMs: grow from a known-good batch, then bisect to 1."""
    t0 = time.perf_counter()
    trials = []
    lo, hi = known_ok, None
    probe = max(lo + 1, int(lo * 1.05))
    while hi is None:
        ok = runs(step, probe, steps)
        trials.append((probe, ok))
        if ok:
            lo, probe = probe, int(probe * 1.25) + 1
        else:
            hi = probe
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = runs(step, mid, steps)
        trials.append((mid, ok))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return {"true_max": lo, "trials": trials, "seconds": time.perf_counter() - t0}


def lightning_power(step, init_val: int = 2, max_trials: int = 25, steps_per_trial: int = 3) -> dict:
    t0 = time.perf_counter()
    batch, last_ok, trials = init_val, None, []
    for _ in range(max_trials):
        ok = runs(step, batch, steps_per_trial)
        trials.append((batch, ok))
        if ok:
            last_ok, batch = batch, batch * 2
        else:
            break  # halve once (back to last_ok) and stop
    return {"found": last_ok, "trials": trials, "trial_count": len(trials), "steps_run": steps_per_trial * len(trials),
            "seconds": time.perf_counter() - t0}


def accelerate_halving(step, starting_batch_size: int, steps: int = 2) -> dict:
    from accelerate.utils import find_executable_batch_size

    calls = []
    t0 = time.perf_counter()

    @find_executable_batch_size(starting_batch_size=starting_batch_size)
    def inner(batch_size):
        calls.append(batch_size)
        for _ in range(steps):
            step(batch_size)
        torch.cuda.synchronize()
        return batch_size

    found = inner()
    gc.collect()
    torch.cuda.empty_cache()
    return {"found": found, "calls": calls, "trial_count": len(calls), "starting_batch_size": starting_batch_size,
            "seconds": time.perf_counter() - t0}


def compare(step, fit, steps: int = 2) -> dict:
    """Brute force (runs of ``steps`` steps, as %gpufit's trials) and the two baselines after a
    %gpufit result ``fit``; and whether its recommendation trains ``steps`` steps right after."""
    truth = true_max(step, fit.recommended, steps)
    start = 2 ** math.ceil(math.log2(2 * truth["true_max"]))
    out = {
        "gpufit": fit.to_dict(),
        "recommended_trains": runs(step, fit.recommended, steps),
        "brute_force": truth,
        "lightning_power": lightning_power(step),
        "accelerate_halving": accelerate_halving(step, start),
    }
    out["gpufit_ratio"] = fit.recommended / truth["true_max"]
    return out
