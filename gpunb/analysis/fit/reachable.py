"""What a training step can reach and a ``%gpufit`` trial can change, found by the shared walk
(:mod:`gpunb.analysis.reach`) from the step function: its bound ``self``, ``functools.partial``
arguments, closure, defaults and the globals its code names, transitively, through containers,
instances, the user's classes and modules, and modules' attributes and hooks.

Sorted by how each is put back (``user_state.py``): modules (weights, buffers, gradients,
modes), optimizers (their state and hyperparameters; the plain tensors they train too),
schedulers, GradScalers, plain tensors, random number generators (``torch.Generator``, NumPy's
``Generator`` and ``RandomState``, ``random.Random``), and the bindings the step could rebind
(the user's containers, the user's objects' attributes, the notebook globals the step names).
What cannot be put back (a Python generator the step draws from, a file it writes) is kept to be
named if it changed.
"""

from __future__ import annotations

import collections
import importlib
import io
import random
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from gpunb.analysis import reach

MAX_NODES = 100_000  # objects walked from the step
MAX_BOUND_ELEMENTS = 100_000  # a container larger than this is not copied, only watched


@dataclass
class Reachable:
    modules: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scalers: list[Any] = field(default_factory=list)
    tensors: list[tuple[str, Any]] = field(default_factory=list)  # plain tensors (not a module's), by path
    generators: list[tuple[str, Any]] = field(default_factory=list)  # RNG objects, by path
    bindings: list[tuple[str, Any, frozenset[str] | None]] = field(default_factory=list)  # (path, holder, names)
    unrestorable: list[tuple[str, Any]] = field(default_factory=list)  # Python generators, files
    truncated: bool = False
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why it could not be read


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

    sched = importlib.import_module("torch.optim.lr_scheduler")
    numpy: Any = sys.modules.get("numpy")  # None without NumPy: its getters raise AttributeError
    return {
        "modules": types_of(lambda: torch.nn.Module),
        "optimizers": types_of(lambda: torch.optim.Optimizer),
        "schedulers": types_of(lambda: sched.LRScheduler, lambda: sched._LRScheduler, lambda: sched.ReduceLROnPlateau),
        "scalers": types_of(lambda: torch.amp.GradScaler, lambda: torch.cuda.amp.GradScaler),
        "generators": types_of(lambda: torch.Generator, lambda: random.Random,
                               lambda: numpy.random.Generator, lambda: numpy.random.RandomState),
    }


_CONTAINERS = (list, dict, set, collections.deque, collections.OrderedDict, collections.defaultdict)


def find_reachable(torch: Any, step_fn: Any, *, max_nodes: int = MAX_NODES) -> Reachable:
    """Everything of the user's the step can reach that a trial can change (see the module doc)."""
    kinds = _kinds(torch)
    found = Reachable()
    walk = reach.Walk(max_nodes=max_nodes)
    module_tensors: set[int] = set()  # parameters and buffers: the modules' save covers them

    def visit(obj: Any, path: str, depth: int, tag: Any) -> bool:
        if isinstance(obj, torch.Tensor):
            found.tensors.append((path, obj))
            return False
        for kind, classes in kinds.items():
            if classes and isinstance(obj, classes):
                obj = cast(Any, obj)
                if kind == "generators":
                    found.generators.append((path, obj))
                    return False
                getattr(found, kind).append(obj)
                if kind == "modules":
                    for sub in obj.modules():
                        walk.mark(sub)
                    for tensor in [*obj.parameters(), *obj.buffers()]:
                        walk.mark(tensor)
                        module_tensors.add(id(tensor))
                    for child_path, value in reach.module_attributes(obj, path):
                        walk.add(value, child_path, depth + 1)
                    binding_of_module(obj, path)
                elif kind == "optimizers":
                    for i, group in enumerate(obj.param_groups):
                        for j, p in enumerate(group.get("params", ())):
                            walk.add(p, f"{path}.param_groups[{i}]['params'][{j}]", depth + 1)
                elif kind == "schedulers":
                    walk.add(getattr(obj, "optimizer", None), f"{path}.optimizer", depth + 1)
                return False
        if isinstance(obj, (types.GeneratorType, io.IOBase)):
            found.unrestorable.append((path, obj))
            return False
        if type(obj) in _CONTAINERS:
            found.bindings.append((path, obj, None))
        elif isinstance(obj, types.FunctionType):
            glob = obj.__globals__
            names = frozenset(n for n in reach.global_names(obj.__code__) if n in glob)
            if names and reach.users_globals(glob):
                found.bindings.append((f"{path}.__globals__", glob, names))
        elif not isinstance(obj, type) and reach.is_user_class(type(obj)) and isinstance(
                getattr(obj, "__dict__", None), dict):
            found.bindings.append((path, obj.__dict__, None))
        return True

    def binding_of_module(module: Any, path: str) -> None:
        for sub_name, sub in module.named_modules():
            if reach.is_user_class(type(sub)):
                names = frozenset(k for k in vars(sub) if isinstance(k, str) and k not in reach.MODULE_INTERNALS)
                if names:
                    found.bindings.append((f"{path}.{sub_name}" if sub_name else path, sub.__dict__, names))

    for name, root in reach.step_roots(step_fn):
        walk.add(root, name)
    walk.run(visit)
    found.tensors = [(p, t) for p, t in found.tensors if id(t) not in module_tensors]
    found.truncated = walk.truncated
    found.skipped = dict(walk.skipped)
    return found

