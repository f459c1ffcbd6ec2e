"""One trial of ``%gpufit``: a training step run as a sustained run, its memory read throughout.

A batch size fits when a sustained run of it trains, in this process and in a fresh one.
Three things make a short run in the fitting process look better than that:

- the first steps are not the steady state: optimizer state appears at the first
  ``optimizer.step()``, cuDNN picks its algorithms (and workspaces) on the first call of each
  shape, and the caching allocator's block layout settles only after a few steps. So a
  trial runs every step of the sustained run and takes the peaks over all of them after the
  first (kept apart: there cuDNN times its algorithms with workspaces sized by the device's free
  memory, not the cap, and catches what does not fit);
- a fresh process lays memory out differently: there the optimizer state (and gradients kept
  between steps) are created during the first step, carved out of the cached blocks the
  activations just freed, so later steps need new segments for those activations. In the
  fitting process the same state was created long before, at a small batch, in blocks of
  its own. After the first step of each trial the state is therefore copied once (same
  values, same tensor objects: ``t.data = t.clone()``), which puts it where a fresh process
  would have put it, and the cache is emptied as a fresh process would never have held it;
- a run that only fits because the allocator gave its cache back under pressure (segments
  freed mid-run, or out-of-memory errors that cuDNN caught to fall back to a smaller
  workspace) is at the edge: the next run, or a fresh process, may not be so lucky. Such a
  trial completes but is not *clean*, and a recommendation must be clean.

The device's memory is read through a small interface (:class:`CudaMemory` on a GPU; the
CPU tests and the benchmark's ``--smoke`` mode pass a fake with a byte budget).
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol, TypeGuard

from gpunb.analysis.batch_fit_records import Trial
from gpunb.analysis.oom_message import find_oom


class DeviceMemory(Protocol):
    """What a trial reads from the device's allocator (bytes)."""

    torch: Any
    device: Any  # the torch.device the step's tensors live on

    def settle(self) -> None: ...  # collect garbage, give the allocator's unused cache back

    def synchronize(self) -> None: ...

    def allocated(self) -> int: ...

    def peaks(self) -> tuple[int, int]: ...  # (allocated, reserved) since reset_peaks

    def reset_peaks(self) -> None: ...

    def pressure(self) -> tuple[int, int]: ...  # cumulative (cache segments released, OOMs raised)


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
        # segment.all.freed counts every cudaFree of a cached segment: the allocator's own release
        # when an allocation would not fit otherwise, and empty_cache(). With cudnn.benchmark, cuDNN
        # empties the cache itself whenever it times a new shape, so there only the allocator's
        # retries (free everything, try again) count. num_ooms also counts the errors cuDNN
        # catches to fall back to a smaller workspace.
        benchmark = bool(getattr(getattr(self.torch.backends, "cudnn", None), "benchmark", False))
        released = stats.get("num_alloc_retries", 0) if benchmark else stats.get("segment.all.freed", 0)
        return int(released), int(stats.get("num_ooms", 0))


class _Peaks:
    """Peaks folded over windows (torch keeps one peak counter; it is reset each step)."""

    def __init__(self) -> None:
        self.allocated = 0
        self.reserved = 0
        self.before_step: int | None = None

    def fold(self, peaks: tuple[int, int]) -> None:
        self.allocated = max(self.allocated, peaks[0])
        self.reserved = max(self.reserved, peaks[1])


def _movable(t: Any, device: Any, torch: Any, seen: set[int]) -> TypeGuard[Any]:
    if not isinstance(t, torch.Tensor) or id(t) in seen or t.device != device or t.is_sparse:
        return False
    seen.add(id(t))
    return t._base is None and t.numel() > 0  # a view shares another tensor's storage: leave it


def relocate_persistent(optimizers: list[Any], device: Any, torch: Any) -> int:
    """Copy gradients and optimizer state in place (``t.data = t.clone()``) so they sit in the
    blocks the current step just freed, as in a fresh process whose first step created them.
    Values and tensor objects stay the same. Optimizers with ``capturable=True`` are left
    alone (a captured CUDA graph may hold their addresses). Returns the bytes moved."""
    moved = 0
    seen: set[int] = set()
    with torch.no_grad():
        for opt in optimizers:
            groups = getattr(opt, "param_groups", None) or []
            if any(g.get("capturable") for g in groups):
                continue
            params = [p for g in groups for p in g.get("params", [])]
            for p in reversed(params):  # backward creates gradients last layer first
                g = getattr(p, "grad", None)
                if _movable(g, device, torch, seen):
                    g.data = g.clone()
                    moved += g.nbytes
            state = getattr(opt, "state", {})
            for p in params:  # then optimizer.step() creates the state, first parameter first
                for value in list(state.get(p, {}).values()) if hasattr(state, "get") else ():
                    if _movable(value, device, torch, seen):
                        value.data = value.clone()
                        moved += value.nbytes
    return moved


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
              purpose: str, capacity: int | None = None, relocate: bool = True,
              nvml_bytes: Callable[[], int | None] | None = None) -> Trial:
    """Run ``step_fn(batch)`` ``steps`` times from an emptied cache and read its memory.

    The first step of a shape is special: cuDNN times its algorithms there (trying workspaces
    that may not fit, and emptying the cache after, with ``cudnn.benchmark``) and a fresh
    process creates its optimizer state. So with more than one step, the peaks and the
    pressure are those of the steady steps after it (the first step's peak is kept apart),
    once the state is laid out as a fresh process would lay it out.

    Only out-of-memory errors are caught (and their frames freed): any other error is the
    user's and is raised. Global optimizer hooks are registered only while the steps run.
    """
    torch = memory.torch
    memory.settle()
    window = [_Peaks()]  # the peaks being folded: the first step's, then the steady steps'
    optimizers: list[Any] = []

    def before_step(opt: Any, *_: Any) -> None:
        peaks, now = window[0], memory.peaks()[0]
        peaks.before_step = now if peaks.before_step is None else max(peaks.before_step, now)
        if not any(o is opt for o in optimizers):
            optimizers.append(opt)

    def after_step(*_: Any) -> None:  # one window per step: the next pre-step reading is that step's own
        window[0].fold(memory.peaks())
        memory.reset_peaks()

    register_pre, register_post = _optimizer_hooks(torch)
    handles = []
    done = relocated = 0
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
            if i == 0 and steps > 1:
                window[0].fold(memory.peaks())
                first_reserved = window[0].reserved
                if relocate:
                    relocated = relocate_persistent(optimizers, memory.device, torch)
                memory.settle()  # a fresh process never held the blocks the state sat in
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
                     steps=steps, steps_done=done, relocated_bytes=relocated, capacity_bytes=capacity,
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
                 relocated_bytes=relocated, capacity_bytes=capacity, first_step_peak_reserved_bytes=first_reserved)
