"""One trial of ``%gpufit``: a training step run as a sustained run, its memory read throughout.

A batch size fits when a sustained run of it trains, in this process and in a fresh one.
Two things make a short run in the fitting process look better than that:

- the first steps are not the steady state: optimizer state appears at the first
  ``optimizer.step()``, cuDNN picks its algorithms (and workspaces) on the first call of each
  shape, and the caching allocator's block layout settles only after a few steps. So a
  trial runs every step of the sustained run and takes the peaks over all of them after the
  first (kept apart: there cuDNN times its algorithms with workspaces sized by the device's free
  memory, not the cap, and catches what does not fit);
- a fresh process lays memory out differently: its optimizer state and gradients are created
  during its first step, carved out of the blocks the activations just freed. So each trial
  starts as a fresh process does (:mod:`gpunb.analysis.fit.fresh_state`): the optimizers' state
  and gradients emptied, the cache given back; its first step creates them where a fresh
  process would, and the steps after it run on that layout, failing where it fails.

A run that needed the allocator to give its cache back (segments freed mid-run), or in which
cuDNN caught out-of-memory errors to fall back to a smaller workspace, still trained: it is
recorded (a fresh process does the same), not held against the batch.

The device's memory is read through a small interface (:class:`CudaMemory` on a GPU; the
CPU tests and the benchmark's ``--smoke`` mode pass a simulated allocator).
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from gpunb.analysis.fit.fresh_state import FreshStart
from gpunb.analysis.fit.records import Trial
from gpunb.analysis.memory.oom_message import find_oom


class DeviceMemory(Protocol):
    """What a trial reads from the device's allocator (bytes)."""

    torch: Any
    device: Any  # the torch.device the step's tensors live on

    def settle(self) -> None: ...  # collect garbage, give the allocator's unused cache back

    def synchronize(self) -> None: ...

    def allocated(self) -> int: ...

    def peaks(self) -> tuple[int, int]: ...  # (allocated, reserved) since reset_peaks

    def reset_peaks(self) -> None: ...

    def pressure(self) -> tuple[int, int]: ...  # cumulative (allocations retried after freeing the cache, OOMs raised)


class CudaMemory:
    """:class:`DeviceMemory` of one CUDA device, through torch's caching allocator."""

    def __init__(self, torch: Any, index: int) -> None:
        self.torch = torch
        self.index = index
        self.device = torch.device("cuda", index)

    def settle(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.index)

    def allocated(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.index))

    def peaks(self) -> tuple[int, int]:
        return (int(self.torch.cuda.max_memory_allocated(self.index)),
                int(self.torch.cuda.max_memory_reserved(self.index)))

    def reset_peaks(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.index)

    def pressure(self) -> tuple[int, int]:
        stats = self.torch.cuda.memory_stats(self.index)
        # num_alloc_retries: an allocation did not fit, so the allocator gave back every cached
        # segment that was entirely free and tried again (empty_cache() calls, ours or cuDNN's,
        # are not counted). num_ooms also counts the errors cuDNN catches to fall back to a
        # smaller workspace.
        return int(stats.get("num_alloc_retries", 0)), int(stats.get("num_ooms", 0))


class _Peaks:
    """Peaks folded over windows (torch keeps one peak counter; it is reset each step)."""

    def __init__(self) -> None:
        self.allocated = 0
        self.reserved = 0
        self.before_step: int | None = None

    def fold(self, peaks: tuple[int, int]) -> None:
        self.allocated = max(self.allocated, peaks[0])
        self.reserved = max(self.reserved, peaks[1])


def _free_after_oom(exc: BaseException, memory: DeviceMemory) -> None:
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
    memory.settle()


def _optimizer_hooks(torch: Any) -> tuple[Any, Any]:
    try:  # torch >= 2.0; torch.optim's namespace hides the submodule, so import it by name
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    except ImportError:
        return None, None
    return register_optimizer_step_pre_hook, register_optimizer_step_post_hook


def run_trial(step_fn: Callable[[int], Any], batch: int, *, memory: DeviceMemory, steps: int, index: int,
              purpose: str, capacity: int | None = None, fresh: FreshStart | None = None,
              nvml_bytes: Callable[[], int | None] | None = None) -> Trial:
    """Run ``step_fn(batch)`` ``steps`` times as a fresh process would and read its memory.

    ``fresh`` empties the optimizers' state and gradients first (and learns, through the
    optimizer pre-step hook, which optimizers the step uses); then the cache is given back.
    The first step of a shape is special: cuDNN times its algorithms there (trying workspaces
    that may not fit, and emptying the cache after, with ``cudnn.benchmark``) and the optimizer
    state is created. So with more than one step, the peaks and the pressure are those of the
    steady steps after it (the first step's peak is kept apart).

    Only out-of-memory errors are caught (and their frames freed): any other error is the
    user's and is raised. Global optimizer hooks are registered only while the steps run.
    """
    torch = memory.torch
    reset = fresh.clear() if fresh is not None else 0
    memory.settle()
    window = [_Peaks()]  # the peaks being folded: the first step's, then the steady steps'

    def before_step(opt: Any, *_: Any) -> None:
        peaks, now = window[0], memory.peaks()[0]
        peaks.before_step = now if peaks.before_step is None else max(peaks.before_step, now)
        if fresh is not None:
            fresh.saw(opt)

    def after_step(*_: Any) -> None:  # one window per step: the next pre-step reading is that step's own
        window[0].fold(memory.peaks())
        memory.reset_peaks()

    register_pre, register_post = _optimizer_hooks(torch)
    handles = []
    done = 0
    base = first_reserved = None
    released0, ooms0 = memory.pressure()
    t0 = time.perf_counter()
    memory.reset_peaks()
    try:
        if register_pre is not None:
            handles = [register_pre(before_step), register_post(after_step)]
        for i in range(steps):
            if i == steps - 1:
                base = memory.allocated()
            step_fn(batch)
            done += 1
            if i == 0 and steps > 1:  # the steady steps start here, on the layout the first one left
                window[0].fold(memory.peaks())
                first_reserved = window[0].reserved
                released0, ooms0 = memory.pressure()
                window[0] = _Peaks()
                memory.reset_peaks()
        memory.synchronize()
    except Exception as exc:  # only OOMs are ours to catch
        oom = find_oom(exc)
        if oom is None:
            raise
        peaks = window[0]
        peaks.fold(memory.peaks())
        message = str(oom).split(". ")[0][:200]
        _free_after_oom(exc, memory)
        del exc, oom
        return Trial(index, batch, False, purpose, peaks.allocated or None, peaks.reserved or None,
                     seconds=time.perf_counter() - t0, error=message, peak_before_step_bytes=peaks.before_step,
                     steps=steps, steps_done=done, state_reset_bytes=reset, capacity_bytes=capacity,
                     first_step_peak_reserved_bytes=first_reserved)
    finally:
        for h in handles:
            h.remove()
    peaks = window[0]
    peaks.fold(memory.peaks())
    released, ooms = memory.pressure()
    proc = nvml_bytes() if nvml_bytes is not None else None
    non_torch = None
    if proc is not None and hasattr(torch, "cuda"):
        non_torch = max(0, proc - int(torch.cuda.memory_reserved(memory.device)))
    return Trial(index, batch, True, purpose, peaks.allocated, peaks.reserved, non_torch,
                 time.perf_counter() - t0, peak_before_step_bytes=peaks.before_step, base_allocated_bytes=base,
                 steps=steps, steps_done=done, cache_releases=released - released0, caught_ooms=ooms - ooms0,
                 state_reset_bytes=reset, capacity_bytes=capacity, first_step_peak_reserved_bytes=first_reserved)
