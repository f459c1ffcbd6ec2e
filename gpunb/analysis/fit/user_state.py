"""Everything of the user's that ``%gpufit``'s trials change, saved before the first trial and put
back after the last one (on success, an OOM, an error in the step and a Ctrl-C): the fit leaves
the user's state exactly as it found it, or names in its notes what it could not put back.

The trials run the user's real training step, so they train: weights, BatchNorm's running
statistics, gradients, plain tensors an optimizer trains, the optimizers' state and
hyperparameters, a learning-rate scheduler stepped inside the step, a GradScaler's scale,
``train()``/``eval()`` modes, and every random number generator: the global ones (Python's,
NumPy's when NumPy is imported, torch's CPU and CUDA ones) and the generator objects the step
reaches (``torch.Generator``, NumPy ``Generator`` and ``RandomState``, ``random.Random``).
Issue 22 measured on the H200: weights changed on two models mid-training, a scheduler left 18
epochs ahead. Lightning's BatchSizeFinder restores the model afterwards too.

What the step can reach is found by the shared walk (``reachable.py``): from the step's bound
``self``, ``functools.partial`` arguments, closure, defaults and the globals its code names,
transitively. The bindings the step could change are saved too, shallowly: the user's lists,
dicts, sets and deques (a history the step appends to), the user's objects' attributes
(``self.global_step += 1``, ``self.acc = torch.cat(...)``) and the notebook globals the step
names (``global best``).

What cannot be put back is named when it changed: a Python generator the step drew from, a file
it wrote, a container too large to copy, an object the walk could not read (a property raising),
the part of a very large reach the walk's node limit left out. State outside Python objects (a
counter in a C extension, an installed package's module globals) is not reached.

Tensors are saved on the host (the device memory is what is being fitted). When that copy would
take more than half of the free host memory the weights are not saved, and the fit says so in
one line. The restore is idempotent (it copies saved values in; run twice, same result) and
holds SIGINT back while it runs: a second Ctrl-C cannot leave a half-restored model.
"""

from __future__ import annotations

import collections
import copy
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis import reach
from gpunb.analysis.fit.reachable import MAX_BOUND_ELEMENTS, Reachable, find_reachable
from gpunb.readings.interrupts import deferred_sigint

__all__ = ["HOST_SHARE", "Reachable", "UserState", "find_reachable"]

HOST_SHARE = 0.5  # save the weights only if their copy takes at most this share of the free host memory


def _host_copy(t: Any) -> tuple[Any, Any]:
    return t.device, t.detach().to("cpu", copy=True)


def _back(saved: tuple[Any, Any]) -> Any:
    device, tensor = saved
    return tensor.to(device, copy=True)


def _copy_value(torch: Any, v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", _host_copy(v))
    try:
        return ("value", copy.deepcopy(v))
    except Exception:  # something that cannot be copied: kept as it is (it is the same object)
        return ("value", v)


def _value_back(torch: Any, saved: tuple[str, Any]) -> Any:
    kind, v = saved
    if kind == "tensor":
        return _back(v)
    try:
        return copy.deepcopy(v)
    except Exception:
        return v


class _Binding:
    """A holder's contents as they were (shallow: the same objects), put back when they differ.
    ``names``: for a namespace or a module's ``__dict__``, only those entries are the user's."""

    def __init__(self, path: str, holder: Any, names: frozenset[str] | None) -> None:
        self.path, self.holder, self.names = path, holder, names
        if isinstance(holder, dict):
            self.saved: Any = {k: holder[k] for k in names if k in holder} if names is not None else dict(holder)
        elif isinstance(holder, (set, frozenset)):
            self.saved = set(holder)
        else:  # list, deque
            self.saved = list(holder)

    def changed(self) -> bool:
        h, saved = self.holder, self.saved
        if isinstance(h, dict):
            keys = saved.keys() if self.names is not None else h.keys()
            return (self.names is None and len(h) != len(saved)) or any(
                k not in h or k not in saved or h[k] is not saved[k] for k in keys)
        if isinstance(h, set):
            return len(h) != len(saved) or any(x not in h for x in saved)
        return len(h) != len(saved) or any(a is not b for a, b in zip(h, saved))

    def put_back(self) -> None:
        if not self.changed():
            return  # untouched: no write (a shared dict another thread reads stays as it is)
        h = self.holder
        if isinstance(h, dict):
            if self.names is None:
                h.clear()
            h.update(self.saved)
        elif isinstance(h, collections.deque):
            h.clear()
            h.extend(self.saved)
        elif isinstance(h, set):
            h.clear()
            h.update(self.saved)
        else:
            h[:] = self.saved


def _rng_state(gen: Any) -> tuple[Callable[[Any], Any], Any]:
    """``(set_state, state)`` for a generator object (torch, NumPy ``Generator``/``RandomState``,
    ``random.Random``)."""
    if isinstance(gen, random.Random):
        return gen.setstate, gen.getstate()
    bit = getattr(gen, "bit_generator", None)
    if bit is not None:  # numpy.random.Generator: its bit generator's state dict

        def set_bit(state: Any, bit: Any = bit) -> None:
            bit.state = copy.deepcopy(state)

        return set_bit, copy.deepcopy(bit.state)
    if hasattr(gen, "get_state") and hasattr(gen, "set_state"):  # torch.Generator, numpy RandomState
        state = gen.get_state()
        return gen.set_state, state.clone() if hasattr(state, "clone") else copy.deepcopy(state)
    raise TypeError(f"{type(gen).__name__} has no state to save")


def _position(obj: Any) -> Any:
    """Where a Python generator or a file stands now (to tell whether the trials moved it)."""
    frame = getattr(obj, "gi_frame", None)
    if hasattr(obj, "gi_frame"):
        return None if frame is None else frame.f_lasti
    try:
        return obj.tell()
    except Exception:  # noqa: BLE001 (closed, or not seekable: it cannot be told)
        return None


@dataclass
class UserState:
    """The saved state; :meth:`restore` puts it back. ``notes``: what could not be saved or put back."""

    torch: Any
    tensors: list[tuple[Any, Any]] = field(default_factory=list)  # (param, buffer or plain tensor, saved copy)
    grads: list[tuple[Any, Any]] = field(default_factory=list)  # (leaf tensor, saved grad or None)
    modes: list[tuple[Any, bool]] = field(default_factory=list)
    optimizers: list[tuple[Any, dict[Any, dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=list)
    schedulers: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    scalers: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    rng: list[tuple[Callable[[Any], Any], Any]] = field(default_factory=list)
    bindings: list[_Binding] = field(default_factory=list)
    watched: list[tuple[str, Any, Any]] = field(default_factory=list)  # (path, generator or file, position)
    notes: list[str] = field(default_factory=list)
    _checked: bool = False

    @classmethod
    def capture(cls, torch: Any, step_fn: Any, *, host_available: Callable[[], int | None] = lambda: None,
                reach: Reachable | None = None) -> UserState:
        found = reach if reach is not None else find_reachable(torch, step_fn)
        saved = cls(torch)
        saved._capture_rng(found.generators)
        saved._capture_tensors(found, host_available)
        saved._capture_optimizers(found.optimizers)
        for sched in found.schedulers:
            try:
                saved.schedulers.append((sched, copy.deepcopy(sched.state_dict())))
            except Exception as exc:  # noqa: BLE001 (a scheduler subclass whose state cannot be copied)
                saved.notes.append(f"{type(sched).__name__} could not be saved ({type(exc).__name__}): "
                                   "the trials may have stepped it")
        for scaler in found.scalers:
            saved.scalers.append((scaler, {k: _copy_value(torch, v) for k, v in vars(scaler).items()}))
        saved._capture_bindings(found)
        return saved

    def _capture_rng(self, generators: list[tuple[str, Any]]) -> None:
        torch = self.torch
        self.rng.append((random.setstate, random.getstate()))
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            self.rng.append((numpy.random.set_state, numpy.random.get_state()))
        self.rng.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
        for path, gen in generators:
            try:
                self.rng.append(_rng_state(gen))
            except Exception as exc:  # noqa: BLE001 (a generator whose state cannot be read: named)
                self.notes.append(f"not restored: the random generator `{path}` ({type(exc).__name__})")

    def _capture_tensors(self, found: Reachable, host_available: Callable[[], int | None]) -> None:
        tensors: dict[int, Any] = {}
        leaves: dict[int, Any] = {}
        for module in found.modules:
            for sub in module.modules():
                self.modes.append((sub, sub.training))
            for p in module.parameters():
                tensors[id(p)] = leaves[id(p)] = p
            for b in module.buffers():
                tensors[id(b)] = b
        for _, t in found.tensors:
            tensors.setdefault(id(t), t)
            if t.is_leaf and t.requires_grad:
                leaves.setdefault(id(t), t)
        size = sum(t.nbytes for t in tensors.values())
        size += sum(p.grad.nbytes for p in leaves.values() if p.grad is not None)
        free = host_available()
        if size and free is not None and size > HOST_SHARE * free:
            names = ", ".join(sorted({type(m).__name__ for m in found.modules} | ({"tensors"} if found.tensors
                                                                                     else set())))
            self.notes.append(f"not restored: the weights, buffers and gradients of {names} ({size / 2**30:.2f} GiB) "
                              f"would take more than half of the free host memory ({free / 2**30:.2f} GiB) to "
                              "save, so the trials trained them")
            return
        self.tensors = [(t, _host_copy(t)) for t in tensors.values()]
        self.grads = [(p, _host_copy(p.grad) if p.grad is not None else None) for p in leaves.values()]

    def _capture_optimizers(self, optimizers: list[Any]) -> None:
        for opt in optimizers:
            try:
                state = {p: {k: _copy_value(self.torch, v) for k, v in s.items()} for p, s in opt.state.items()}
                groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
            except Exception as exc:  # noqa: BLE001 (an optimizer subclass with odd state)
                self.notes.append(f"{type(opt).__name__}'s state could not be saved ({type(exc).__name__})")
                continue
            self.optimizers.append((opt, state, groups))

    def _capture_bindings(self, found: Reachable) -> None:
        for path, holder, names in found.bindings:
            try:
                size = len(names) if names is not None else len(holder)
                if size > MAX_BOUND_ELEMENTS:
                    self.watched.append((path, holder, size))
                    continue
                self.bindings.append(_Binding(path, holder, names))
            except BaseException as exc:  # noqa: BLE001 (a hostile container: named, not saved)
                if reach.passes(exc):
                    raise
                found.skipped.setdefault(path, type(exc).__name__)
        for path, obj in found.unrestorable:
            try:
                self.watched.append((path, obj, _position(obj)))
            except BaseException as exc:  # noqa: BLE001 (a hostile object)
                if reach.passes(exc):
                    raise
        if found.skipped:
            paths = ", ".join(f"`{p}`" for p in list(found.skipped)[:5])
            self.notes.append(f"not saved: {len(found.skipped)} object(s) the step reaches could not be read "
                              f"({paths}: {next(iter(found.skipped.values()))}); the trials may have changed them")
        if found.truncated:
            self.notes.append("not saved: the step reaches more objects than the walk looks at "
                              "(100,000, or 10,000 per container); those past the limit may have changed")

    def restore(self) -> None:
        """Put everything back (idempotent), with SIGINT held back until it is done; then name what
        changed and could not be put back."""
        torch = self.torch
        with deferred_sigint(), torch.no_grad():
            for t, saved in self.tensors:
                t.copy_(saved[1])  # in place: the optimizer and the user's names keep the same tensors
            for p, grad in self.grads:
                p.grad = _back(grad) if grad is not None else None
            for module, training in self.modes:
                module.training = training  # as train()/eval() set it, module by module
            for opt, state, groups in self.optimizers:
                opt.state.clear()
                for p, st in state.items():
                    opt.state[p] = {k: _value_back(torch, v) for k, v in st.items()}
                for group, hyper in zip(opt.param_groups, groups):
                    group.update(copy.deepcopy(hyper))
            for sched, sd in self.schedulers:
                sched.load_state_dict(copy.deepcopy(sd))
            for scaler, attrs in self.scalers:
                for k, v in attrs.items():
                    setattr(scaler, k, _value_back(torch, v))
            for binding in self.bindings:
                binding.put_back()
            for set_state, value in self.rng:
                set_state(value)
            if not self._checked:
                self._checked = True
                self._name_what_moved()

    def _name_what_moved(self) -> None:
        for path, obj, before in self.watched:
            try:
                now = len(obj) if isinstance(before, int) and isinstance(obj, (list, dict, set,
                                                                              collections.deque)) else _position(obj)
            except BaseException as exc:  # noqa: BLE001 (a hostile object)
                if reach.passes(exc):
                    raise
                continue
            if now == before:
                continue
            if hasattr(obj, "gi_frame"):
                what = "a generator the trials drew from: it cannot be rewound"
            elif hasattr(obj, "tell"):
                what = "a file the trials wrote to or read from: not undone"
            else:
                what = f"too large to copy ({before:,} elements, now {now:,})"
            self.notes.append(f"not restored: `{path}`, {what}")
