"""The hooks a profiled cell installs, and takes out again when it ends.

Over 500 lines on purpose: the hooks go in and come out as one transaction (every undo recorded
before its hook goes in), which only holds while one class owns them all.

What each one measures, without changing the user's code:

- **steps**: a global optimizer-step post hook (torch >= 2.0) notes the host time and, when
  one is due, records a CUDA event on the current stream (``step_events.py``: spaced out
  while the GPU keeps up with the host, pooled, read back once completed; never a
  synchronize per step, which cost +4-6 % on the H200). It is the only per-step code.
- **data wait**: ``_BaseDataLoaderIter.__next__`` is wrapped; the time inside it is the time
  the loop waited for its next batch.
- **host syncs**: ``Tensor.item/tolist/cpu/__float__/__int__/__bool__/__repr__/__format__`` are
  wrapped; on a CUDA tensor each call waits for the GPU to finish the queued work. Reads made
  by ``torch.optim`` code itself pass through uncounted (not the user's), and Adam's
  per-parameter step-counter reads skip the wrapper altogether (``_bypass_optimizer_item``).
  ``torch.Tensor`` is changed only when the cell starts and ends.
- **memory timeline**: at a step end at most every ``TIMELINE_EVERY_S`` (200 ms),
  torch's allocated/reserved bytes and NVML's device "used".
- **output**: ``sys.stdout.write`` / ``sys.stderr.write`` are timed.
- **a closer look at a few steps**: ``step_watch(index)``, when set, is called at the end of
  each step until it returns False (``step_plan.py``: the FLOP count of step 2, ``--ops``);
  ``leak_watch(index)`` at every step end (the leak finder: one comparison until a look is due).
- **energy**: ``step_meter(steps)``, when set, is called at every step end with the steps so
  far (``profile/cell_energy.py``: it asks the NVML worker for the counters, never waits).

When the cell starts before torch is imported, the torch hooks are put in the moment the
cell imports it (``gpunb.readings.import_watch``).

Every wrapper marks its frame ``__tracebackhide__`` so IPython shows a user's exception
exactly as without gpunb.

Install and remove are one transaction: each hook's undo is written down *before* the hook
goes in (every undo is harmless when its hook never went in, and harmless twice), ``remove``
drops an undo only after it ran, and a Ctrl-C is held back while either runs
(``readings/interrupts.py``). An exception at any line of either leaves the process as
before the cell once ``remove`` has run (``tests/test_fault_transactions.py`` raises one at
every line).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

from gpunb.analysis.steps.events import StepEvents
from gpunb.analysis.steps.tokens import first_tensor, sequence_length
from gpunb.readings import torch_state
from gpunb.readings.import_watch import ImportWatch
from gpunb.readings.interrupts import deferred_sigint
from gpunb.readings.transaction import Transaction

# Tensor methods that copy a value to the host (a sync when the tensor is on a GPU).
SYNC_METHODS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__repr__", "__format__")
TIMELINE_EVERY_S = 0.2  # a memory-timeline point at most this often (~26 µs each alone, at a step end)
# Reads made by optimizer code are not the user's (LBFGS reads its loss); the schedulers'
# reads are of the user's tensors (ReduceLROnPlateau.step(val_loss)), so they count.
_OPTIMIZER_CODE = "torch.optim."
_USER_FACING_OPTIM = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")


def batch_length(batch: Any) -> int | None:
    """Samples in a batch: first dimension of the first tensor found (tensor, sequence or dict)."""
    tensor = first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and len(tensor.shape) else None


def _call_warning_at_caller(original: Callable[..., Any], tensor: Any, args: tuple[Any, ...],
                            kwargs: dict[str, Any]) -> Any:
    """Call ``original`` and re-issue its warnings at the user's line, not this module's
    (torch attributes C++ warnings to the innermost Python frame, which is our wrapper)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = original(tensor, *args, **kwargs)
    caller = sys._getframe(2)  # 0: here, 1: the wrapper, 2: the user's code
    registry = caller.f_globals.setdefault("__warningregistry__", {})
    for w in caught:
        warnings.warn_explicit(w.message, w.category, caller.f_code.co_filename, caller.f_lineno,
                               module=caller.f_globals.get("__name__"), registry=registry)
    return result


def _restore_write(stream: Any, timed: Callable[..., Any], previous: Callable[..., Any] | None) -> None:
    if getattr(stream, "__dict__", {}).get("write") is not timed:
        return  # someone replaced it after us: leave theirs
    if previous is None:
        del stream.write
    else:
        stream.write = previous


def _remove_handles(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()  # a RemovableHandle: a no-op once removed


def _put_back(owner: Any, name: str, original: Any, ours: Any) -> None:
    if owner.__dict__.get(name) is ours:  # unless it never went in, or someone replaced ours since
        setattr(owner, name, original)


def _restore_stream(attr: str, stream: Any, proxy: Any) -> None:
    if getattr(sys, attr) is proxy:  # unless someone replaced our proxy since
        setattr(sys, attr, stream)


class _TimedStream:
    """Stand-in for a stream whose ``write`` cannot be replaced (C-level ``TextIOWrapper``)."""

    def __init__(self, stream: Any, timed_write: Callable[[str], int]) -> None:
        self._stream = stream
        self.write = timed_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_optim_names: tuple[int, tuple[str, ...]] = (-1, ())  # (len(sys.modules) then, torch.optim's modules)


def _optimizer_module_names() -> tuple[str, ...]:
    """The loaded modules of ``torch.optim``, looked for again only when the number of loaded
    modules changed: walking all of them (thousands with torch) cost a cell's start ~3 ms on
    the H200 machine (benchmarks/profile_overhead.py). A module missed here only keeps the
    wrapped ``item`` (a fraction of a µs per read)."""
    global _optim_names
    count = len(sys.modules)
    if _optim_names[0] != count:
        _optim_names = (count, tuple(name for name in list(sys.modules) if name.startswith("torch.optim")))
    return _optim_names[1]


class Instruments:
    """Measurements of one profiled cell. ``install`` then ``remove`` (idempotent)."""

    def __init__(self, torch: Any | None, *, memory_every_s: float | None = TIMELINE_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.torch: Any = torch  # the module; None only without torch, where no CUDA path runs
        self.clock = clock
        # None (no timeline) as an interval never reached: the per-step test stays one comparison
        self._memory_every = float("inf") if memory_every_s is None else memory_every_s
        # steps: host time of each step of the first optimizer seen (a GAN's second
        # optimizer would count every iteration twice)
        self.step_t: list[float] = []
        # steps are the cell's when they run in the thread that started it (made these
        # instruments); a background thread's training is counted apart, not mixed in
        self._thread: int | None = threading.get_ident()  # None: every thread's steps count
        self.other_thread_steps = 0
        self.step_events: StepEvents | None = None  # made at the first step that finds CUDA up
        version = getattr(torch, "version", None)
        # a CPU-only torch build never gets CUDA: skip the per-step "is CUDA up yet?" check
        self._no_events = not (getattr(version, "cuda", None) or getattr(version, "hip", None))
        self.start_event: Any = None
        self._primary: int | None = None
        self._other_optimizers: set[int] = set()
        self.param_device_types: set[str] = set()
        self.param_dtypes: set[str] = set()
        self.param_count = 0
        # data
        self.fetch_n = 0
        self.fetch_s = 0.0
        self.first_fetch_t: float | None = None
        self.samples = 0
        self.batch_size: int | None = None
        self.loader_workers: int | None = None
        self.loader_pin_memory: bool | None = None
        # syncs
        self.sync_n = 0
        self.sync_gpu_n = 0
        self.sync_s = 0.0
        self.sync_gpu_s = 0.0
        self.sync_by_method: dict[str, int] = {}
        # per thread: inside a counted read its own nested reads are not counted again (one flag shared
        # by threads made a background thread's read hide the cell's, or the other way round)
        self._reading = threading.local()
        # output
        self.write_n = 0
        self.write_chars = 0
        self.write_s = 0.0
        # memory timeline: (t, bytes allocated, bytes reserved) on GPU, (t, rss, None) on CPU
        self.memory: list[tuple[float, int, int | None]] = []
        self._last_memory_t = -1e9
        self.device_used: Callable[[], int | None] | None = None  # NVML "used" of the cell's GPU
        self.device_used_peak: int | None = None
        # called with the step's index at every step end while it returns True (step_plan.py)
        self.step_watch: Callable[[int], bool] | None = None
        # called with the number of steps so far at every step end (the cell's energy meter)
        self.step_meter: Callable[[int], None] | None = None
        self.sequence_length: int | None = None  # tokens per sample of the first batch (token ids only)
        # called with the step's index at every step end: the leak finder (analysis/leaks/finder.py)
        self.leak_watch: Callable[[int], bool] | None = None
        # called with the module when the cell itself imports torch (after the hooks are in)
        self.on_torch_import: Callable[[Any], None] | None = None
        self._transaction = Transaction("profile instruments")  # every hook's undo, registered before it goes in
        self._undo = self._transaction.undos
        self.installed = False

    # -- life cycle ---------------------------------------------------------------------
    def install(self, cuda: bool) -> None:
        """Hook in. ``cuda``: CUDA was initialised when the cell started (start event recorded).
        Without torch yet, the torch hooks go in the moment the cell imports it: the most
        common training cell starts with ``import torch``."""
        torch = self.torch
        self.installed = True
        with deferred_sigint():
            if torch is not None:
                if cuda:
                    self.start_event = torch.cuda.Event(enable_timing=True)
                    self.start_event.record()
                self._hook_torch(torch)
            else:
                watch = ImportWatch("torch", self._torch_imported)
                self._transaction.add(watch.remove)
                sys.meta_path.insert(0, watch)  # as when_imported does, with the undo first
            self._wrap_output()
        self.sample_memory(force=True)

    def _hook_torch(self, torch: Any) -> None:
        self._hook_optimizer(torch)
        self._wrap_dataloader(torch)
        self._wrap_tensor_syncs(torch)

    def _torch_imported(self, module: Any) -> None:
        """The cell imported torch: hook in now (CUDA cannot be up yet, so no start event;
        step events begin at the first step that finds CUDA initialised)."""
        if not self.installed or self.torch is not None or not hasattr(module, "cuda"):
            return
        self.torch = module
        version = getattr(module, "version", None)
        self._no_events = not (getattr(version, "cuda", None) or getattr(version, "hip", None))
        with deferred_sigint():
            self._hook_torch(module)
        if self.on_torch_import is not None:
            self.on_torch_import(module)

    def remove(self) -> None:
        """Take every hook out, newest first (idempotent; :meth:`Transaction.close`: an undo
        interrupted by a ``KeyboardInterrupt`` runs once more, the others still run, and that
        exception is raised at the end)."""
        try:
            self._transaction.close()
        finally:
            self.installed = False

    # -- steps ------------------------------------------------------------------------------
    def _hook_optimizer(self, torch: Any) -> None:
        try:  # torch.optim does not always expose the submodule as an attribute
            module = importlib.import_module("torch.optim.optimizer")
        except ImportError:
            return
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:  # torch < 2.0: no global optimizer hooks
            return
        handles: list[Any] = []
        self._transaction.add(partial(_remove_handles, handles))
        handles.append(register(self._on_step))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Runs after every optimizer.step(): a launch-bound loop pays all of this per step
        # (benchmarks/profile_overhead.py), so the common path is a few attribute reads.
        t = self.clock()
        if self._thread is not None and threading.get_ident() != self._thread:
            self.other_thread_steps += 1
            return
        if id(optimizer) != self._primary and not self._first_step(optimizer):
            return
        self.step_t.append(t)
        events = self.step_events
        if events is not None:
            try:
                events.step(len(self.step_t) - 1, t)
            except RuntimeError:  # a broken CUDA context: the user's next CUDA call will say so
                self.step_events, self._no_events = None, True
        elif not self._no_events and self.torch.cuda.is_initialized():  # CUDA is up: time from here
            self._start_step_events()
        if t - self._last_memory_t >= self._memory_every:
            self.sample_memory()
        watch = self.step_watch
        if watch is not None and not watch(len(self.step_t) - 1):
            self.step_watch = None  # nothing left to look at: the per-step path is one test again
        meter = self.step_meter
        if meter is not None:
            meter(len(self.step_t))
        leaks = self.leak_watch
        if leaks is not None:
            leaks(len(self.step_t) - 1)

    def _first_step(self, optimizer: Any) -> bool:
        """True when ``optimizer`` is the one whose steps are counted (the first one seen)."""
        if self._primary is not None:
            self._other_optimizers.add(id(optimizer))  # a GAN's second optimizer: not a new step
            return False
        self._primary = id(optimizer)
        self._note_params(optimizer)
        return True

    def _start_step_events(self) -> None:
        try:
            self.step_events = StepEvents(self.torch, self.torch.cuda.current_device(), self.start_event)
            self.step_events.step(len(self.step_t) - 1, self.step_t[-1])
        except RuntimeError:  # a broken CUDA context: the user's next CUDA call will say so
            self.step_events, self._no_events = None, True

    @property
    def step_spans(self) -> list[tuple[int, int, float]]:
        """(first step, last step, GPU ms) from the CUDA events (after ``finish_steps``)."""
        return self.step_events.spans if self.step_events is not None else []

    def _note_params(self, optimizer: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.param_count += p.numel()
                self.param_device_types.add(p.device.type)
                self.param_dtypes.add(str(p.dtype).replace("torch.", ""))

    def finish_steps(self) -> None:
        """Read back every step's GPU time (waits for the GPU once, at the end of the cell)."""
        if self.step_events is not None:
            self.step_events.finish()

    @property
    def optimizers(self) -> int:
        return (self._primary is not None) + len(self._other_optimizers)

    # -- data loader ------------------------------------------------------------------------
    def _wrap_dataloader(self, torch: Any) -> None:
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter
        except ImportError:
            return
        original = _BaseDataLoaderIter.__dict__.get("__next__")
        if original is None:
            return
        recorder = self

        def __next__(it: Any) -> Any:
            __tracebackhide__ = True  # IPython hides this frame in the user's tracebacks
            t0 = recorder.clock()
            batch = original(it)  # StopIteration passes through uncounted
            recorder.fetch_s += recorder.clock() - t0
            recorder.fetch_n += 1
            if recorder.first_fetch_t is None:
                recorder.first_fetch_t = t0
                recorder.loader_workers = getattr(it, "_num_workers", None)
                recorder.loader_pin_memory = getattr(it, "_pin_memory", None)
                recorder.sequence_length = sequence_length(batch)
            n = batch_length(batch)
            if n:
                recorder.samples += n
                recorder.batch_size = recorder.batch_size or n
            return batch

        self._transaction.add(partial(_put_back, _BaseDataLoaderIter, "__next__", original, __next__))
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign, assignment]  # wrapped for the cell

    # -- host syncs -------------------------------------------------------------------------
    def _wrap_tensor_syncs(self, torch: Any) -> None:
        tensor = torch.Tensor
        self._tensor = tensor
        self._wrapped: dict[str, Callable[..., Any]] = {}
        self._own: dict[str, Any] = {}
        # Every assignment to a Tensor attribute invalidates the attribute cache of Tensor and
        # its subclasses; from CPython 3.13 a class gets at most 1000 new cache versions, after
        # which every method lookup on it stays uncached for the life of the process (measured
        # with a plain class on 3.13.0: 27 -> 84 ns per method call after 1200 changes). So read
        # every original first and assign all wrappers in one go (2 versions per cell, not one
        # per name), and never touch the class per step.
        originals = {name: getattr(tensor, name, None) for name in SYNC_METHODS}
        for name, original in originals.items():
            if original is not None:
                self._own[name] = tensor.__dict__.get(name)
                self._wrapped[name] = self._sync_wrapper(name, original)
        self._transaction.add(self._unwrap_tensor_syncs)
        for name, wrapper in self._wrapped.items():
            setattr(tensor, name, wrapper)
        if originals["item"] is not None:
            self._bypass_optimizer_item(torch, originals["item"])

    def _bypass_optimizer_item(self, torch: Any, item: Callable[..., Any]) -> None:
        """Adam, AdamW, NAdam, RAdam, Adamax, Adagrad and ASGD read each parameter's step
        counter with ``torch.optim.optimizer._get_value`` (``.item()`` on a CPU tensor): twice
        per parameter per step in the foreach versions. Through the wrapper each read costs
        ~0.6 µs more (32 reads of an 8-layer MLP: ~20 µs a step, 0.7 % of a 2.6 ms step on
        the H200 VM), so for the cell those modules get the same function calling the
        unwrapped ``item``; the reads were never counted as syncs anyway."""
        original = getattr(sys.modules.get("torch.optim.optimizer"), "_get_value", None)
        compiler = getattr(torch, "compiler", None)
        if original is None or compiler is None or not hasattr(compiler, "is_compiling"):
            return  # another torch layout: the wrappers' pass-through still handles these reads
        is_compiling, is_scripting, tensor = compiler.is_compiling, torch.jit.is_scripting, torch.Tensor

        def _get_value(x: Any) -> Any:  # torch's own logic, with the C method for .item()
            if not is_scripting() and is_compiling():
                return x
            return item(x) if isinstance(x, tensor) else x

        patched: list[Any] = [m for m in map(sys.modules.get, _optimizer_module_names())
                              if getattr(m, "_get_value", None) is original]

        def restore() -> None:
            for module in patched:
                if getattr(module, "_get_value", None) is _get_value:  # unless someone replaced ours
                    module._get_value = original

        self._transaction.add(restore)
        for module in patched:
            module._get_value = _get_value

    def _unwrap_tensor_syncs(self) -> None:
        tensor = self._tensor
        for name, wrapper in self._wrapped.items():
            if tensor.__dict__.get(name) is not wrapper:
                continue  # never went in, already out, or replaced by someone since: leave it
            own = self._own.get(name)
            if own is not None:
                setattr(tensor, name, own)
            else:
                delattr(tensor, name)

    def _sync_wrapper(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self
        # float(t)/int(t) warn about requires_grad from C++, at the calling Python frame
        reattribute = name in ("__float__", "__int__")

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # IPython hides this frame in the user's tracebacks
            if recorder._thread is not None and threading.get_ident() != recorder._thread:
                return original(self, *args, **kwargs)  # another thread's read: not the cell's
            if getattr(recorder._reading, "quiet", False):  # __format__ calling item(): one read, counted once
                return original(self, *args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith(_OPTIMIZER_CODE) and not caller.startswith(_USER_FACING_OPTIM):
                return original(self, *args, **kwargs)  # an optimizer's own read: not the user's
            on_gpu = self.device.type != "cpu"
            if name == "cpu" and not on_gpu:
                return original(self, *args, **kwargs)  # already on the host: no copy, no sync
            recorder._reading.quiet = True
            t0 = recorder.clock()
            try:
                if reattribute and self.requires_grad:
                    return _call_warning_at_caller(original, self, args, kwargs)
                return original(self, *args, **kwargs)
            finally:
                dt = recorder.clock() - t0
                recorder._reading.quiet = False
                recorder.sync_n += 1
                recorder.sync_s += dt
                recorder.sync_by_method[name] = recorder.sync_by_method.get(name, 0) + 1
                if on_gpu:
                    recorder.sync_gpu_n += 1
                    recorder.sync_gpu_s += dt

        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    # -- output -----------------------------------------------------------------------------
    def _wrap_output(self) -> None:
        for attr in ("stdout", "stderr"):
            stream = getattr(sys, attr)
            if stream is None:
                continue
            original = stream.write
            timed = self._timed_write(original)
            previous = getattr(stream, "__dict__", {}).get("write")  # an outer profile's timer
            self._transaction.add(partial(_restore_write, stream, timed, previous))
            try:
                stream.write = timed  # ipykernel's OutStream and pytest's capture allow this
            except (AttributeError, TypeError):
                proxy = _TimedStream(stream, timed)
                self._transaction.add(partial(_restore_stream, attr, stream, proxy))
                setattr(sys, attr, proxy)

    def _timed_write(self, original: Callable[[str], int]) -> Callable[[str], int]:
        recorder = self

        def write(text: str) -> int:
            __tracebackhide__ = True  # IPython hides this frame in the user's tracebacks
            if recorder._thread is not None and threading.get_ident() != recorder._thread:
                return original(text)  # another thread's output: not the cell's
            t0 = recorder.clock()
            try:
                return original(text)
            finally:
                recorder.write_s += recorder.clock() - t0
                recorder.write_n += 1
                recorder.write_chars += len(text) if isinstance(text, str) else 0

        return write

    # -- memory timeline ----------------------------------------------------------------------
    def note_device_used(self, used: int | None) -> None:
        """A reading of NVML's used bytes on the cell's GPU (None: none came)."""
        if used is not None and (self.device_used_peak is None or used > self.device_used_peak):
            self.device_used_peak = used

    def sample_memory(self, force: bool = False) -> None:
        """One point of the memory timeline, at most every ``memory_every_s`` at a step end."""
        if self._memory_every == float("inf") and not force:
            return
        t = self.clock()
        self._last_memory_t = t
        torch = self.torch
        if self.device_used is not None:  # NVML device memory: the peak beyond torch's view
            self.note_device_used(self.device_used())
        try:
            if torch is not None and torch.cuda.is_initialized():
                stats = torch_state.read_allocator(torch, torch.cuda.current_device())
                self.memory.append((t, stats.allocated_bytes, stats.reserved_bytes))
            else:
                from gpunb.readings.process import read_process_usage

                rss = read_process_usage().rss_bytes
                if rss is not None:
                    self.memory.append((t, rss, None))
        except Exception:
            pass
