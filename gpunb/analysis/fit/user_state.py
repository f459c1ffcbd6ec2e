"""Everything of the user's that ``%gpufit``'s trials change, saved before the first trial and put
back after the last one: the fit leaves the model exactly as it found it.

The trials run the user's real training step, so they train: weights, BatchNorm's running
statistics, gradients, the optimizers' state and hyperparameters, a learning-rate scheduler
stepped inside the step, a GradScaler's scale, the random number generators (Python's, NumPy's
global one when NumPy is imported, torch's CPU and CUDA ones) and ``train()``/``eval()`` modes.
Issue 22 measured on the H200: weights changed on two models mid-training, a scheduler left 18
epochs ahead. Lightning's BatchSizeFinder restores the model afterwards too.

What the step can reach is found from the step function itself: the globals its code names
(in a notebook, the notebook's variables), its closure, its defaults and, for a bound method
or a callable object, the object's attributes; one level into lists, tuples, dicts and
objects. Modules, optimizers, schedulers (``torch.optim.lr_scheduler``) and GradScalers found
there are saved; a scheduler's optimizer too.

Tensors are saved on the host (the device memory is what is being fitted). When that copy would
take more than half of the free host memory the weights are not saved, and the fit says so in
one line. The restore is idempotent (it copies saved values in; run twice, same result) and
holds SIGINT back while it runs: a second Ctrl-C cannot leave a half-restored model.
"""

from __future__ import annotations

import copy
import random
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpunb.readings.interrupts import deferred_sigint

HOST_SHARE = 0.5  # save the weights only if their copy takes at most this share of the free host memory
_SCAN_ITEMS = 1000  # items looked at per container


@dataclass
class Reachable:
    modules: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scalers: list[Any] = field(default_factory=list)


def _kinds(torch: Any) -> dict[str, tuple[type, ...]]:
    def types_of(*getters: Callable[[], Any]) -> tuple[type, ...]:
        out = []
        for get in getters:
            try:
                t = get()
            except (AttributeError, ImportError):
                continue
            if isinstance(t, type):
                out.append(t)
        return tuple(out)

    import importlib

    sched = importlib.import_module("torch.optim.lr_scheduler")
    return {
        "modules": types_of(lambda: torch.nn.Module),
        "optimizers": types_of(lambda: torch.optim.Optimizer),
        "schedulers": types_of(lambda: sched.LRScheduler, lambda: sched._LRScheduler, lambda: sched.ReduceLROnPlateau),
        "scalers": types_of(lambda: torch.amp.GradScaler, lambda: torch.cuda.amp.GradScaler),
    }


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a nested function or comprehension
            yield from _global_names(const)


def _roots(step_fn: Any) -> list[Any]:
    """The objects the step can reach directly."""
    out: list[Any] = []
    fn = step_fn
    owner = getattr(step_fn, "__self__", None)
    if owner is not None:
        out.append(owner)
        fn = getattr(step_fn, "__func__", step_fn)
    elif not isinstance(step_fn, types.FunctionType):  # a callable object: its attributes, its __call__
        out.append(step_fn)
        fn = type(step_fn).__dict__.get("__call__") if hasattr(type(step_fn), "__dict__") else None
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        glob = getattr(fn, "__globals__", {}) or {}
        out += [glob[name] for name in dict.fromkeys(_global_names(code)) if name in glob]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    out += list(getattr(fn, "__defaults__", None) or ())
    out += list((getattr(fn, "__kwdefaults__", None) or {}).values())
    return out


def find_reachable(torch: Any, step_fn: Any) -> Reachable:
    """Modules, optimizers, schedulers and GradScalers the step can reach (see the module doc)."""
    kinds = _kinds(torch)
    found = Reachable()
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, str, bytes, int, float)):
            return
        seen.add(id(obj))
        if isinstance(obj, (types.FunctionType, types.MethodType)):  # a wrapper around the step, a helper
            if depth > 0:
                for root in _roots(obj):
                    visit(root, depth - 1)
            return
        try:
            for kind, classes in kinds.items():
                if classes and isinstance(obj, classes):
                    getattr(found, kind).append(obj)
                    if kind == "schedulers":
                        visit(getattr(obj, "optimizer", None), depth)
                    return
            if depth <= 0 or isinstance(obj, torch.Tensor):
                return
            if isinstance(obj, dict):
                items = list(obj.values())[:_SCAN_ITEMS]
            elif isinstance(obj, (list, tuple)):
                items = list(obj[:_SCAN_ITEMS])
            else:
                attrs = getattr(obj, "__dict__", None)
                items = list(attrs.values())[:_SCAN_ITEMS] if isinstance(attrs, dict) else []
        except BaseException:  # noqa: BLE001 (a user object may raise anything on a look)
            return
        for item in items:
            visit(item, depth - 1)

    for root in _roots(step_fn):
        visit(root, 2)
    return found


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


@dataclass
class UserState:
    """The saved state; :meth:`restore` puts it back. ``notes``: what could not be saved."""

    torch: Any
    tensors: list[tuple[Any, Any]] = field(default_factory=list)  # (param or buffer, saved copy)
    grads: list[tuple[Any, Any]] = field(default_factory=list)  # (param, saved grad or None)
    modes: list[tuple[Any, bool]] = field(default_factory=list)
    optimizers: list[tuple[Any, dict[Any, dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=list)
    schedulers: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    scalers: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    rng: list[tuple[Callable[[Any], Any], Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def capture(cls, torch: Any, step_fn: Any, *, host_available: Callable[[], int | None] = lambda: None,
                reach: Reachable | None = None) -> UserState:
        reach = reach if reach is not None else find_reachable(torch, step_fn)
        saved = cls(torch)
        saved._capture_rng()
        saved._capture_modules(reach.modules, host_available)
        saved._capture_optimizers(reach.optimizers, host_available)
        for sched in reach.schedulers:
            try:
                saved.schedulers.append((sched, copy.deepcopy(sched.state_dict())))
            except Exception as exc:
                saved.notes.append(f"{type(sched).__name__} could not be saved ({type(exc).__name__}): "
                                   "the trials may have stepped it")
        for scaler in reach.scalers:
            saved.scalers.append((scaler, {k: _copy_value(torch, v) for k, v in vars(scaler).items()}))
        return saved

    def _capture_rng(self) -> None:
        torch = self.torch
        self.rng.append((random.setstate, random.getstate()))
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            self.rng.append((numpy.random.set_state, numpy.random.get_state()))
        self.rng.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))

    def _capture_modules(self, modules: list[Any], host_available: Callable[[], int | None]) -> None:
        tensors: dict[int, Any] = {}
        params: dict[int, Any] = {}
        for module in modules:
            for sub in module.modules():
                self.modes.append((sub, sub.training))
            for p in module.parameters():
                tensors[id(p)] = p
                params[id(p)] = p
            for b in module.buffers():
                tensors[id(b)] = b
        size = sum(t.nbytes for t in tensors.values())
        size += sum(p.grad.nbytes for p in params.values() if p.grad is not None)
        free = host_available()
        if size and free is not None and size > HOST_SHARE * free:
            names = ", ".join(sorted({type(m).__name__ for m in modules}))
            self.notes.append(f"not restored: the weights, buffers and gradients of {names} ({size / 2**30:.2f} GiB) "
                              f"would take more than half of the free host memory ({free / 2**30:.2f} GiB) to "
                              "save, so the trials trained them")
            return
        self.tensors = [(t, _host_copy(t)) for t in tensors.values()]
        self.grads = [(p, _host_copy(p.grad) if p.grad is not None else None) for p in params.values()]

    def _capture_optimizers(self, optimizers: list[Any], host_available: Callable[[], int | None]) -> None:
        for opt in optimizers:
            try:
                state = {p: {k: _copy_value(self.torch, v) for k, v in s.items()} for p, s in opt.state.items()}
                groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
            except Exception as exc:
                self.notes.append(f"{type(opt).__name__}'s state could not be saved ({type(exc).__name__})")
                continue
            self.optimizers.append((opt, state, groups))

    def restore(self) -> None:
        """Put everything back (idempotent), with SIGINT held back until it is done."""
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
            for set_state, value in self.rng:
                set_state(value)
