"""Generated notebook object graphs for the walk's property tests (``tests/test_reach_properties.py``)
and the leak finder's recall benchmark (``benchmarks/leak_recall.py``).

A graph is a chain of holders from a notebook name down to a planted object: each link one of
the holders a notebook uses (list, tuple, dict, defaultdict, OrderedDict, deque, set, frozenset,
an instance's ``__dict__`` or ``__slots__``, a class attribute reached through an instance, a
dataclass, a namedtuple, a closure, a ``functools.partial``, a bound method, an ``nn.Module``
attribute, a module object of the user's), with a cycle back to the root now and then, and
siblings that are hostile (attribute access raising ``Exception`` or ``BaseException``, a
``__class__`` that raises, a mutating ``__iter__``) or huge (more elements than the walk reads).

The builder draws its choices through ``choose(options)``: Hypothesis's ``data.draw`` in the
tests, a seeded ``random.Random`` in the benchmark, so both sample the same space.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import dataclasses
import functools
import re
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from gpunb.analysis import reach

Choose = Callable[[Sequence[Any]], Any]

# link kind -> depth it costs the walk (a class attribute via an instance: the instance, then its class)
LINKS = {"list": 1, "tuple": 1, "dict": 1, "defaultdict": 1, "ordereddict": 1, "deque": 1, "set": 1,
         "frozenset": 1, "instance": 1, "slots": 1, "class": 2, "dataclass": 1, "namedtuple": 1, "closure": 1,
         "partial": 1, "method": 2, "module_attr": 1, "user_module": 1}
HOSTILE = ("raise exception", "raise cancelled", "raise base", "class raises", "mutating iter", "huge")


class Plain:
    pass


class Slotted:
    __slots__ = ("held",)


@dataclasses.dataclass
class Data:
    held: Any


class Pair(NamedTuple):
    held: Any
    other: int


class Owner:
    def __init__(self, held: Any) -> None:
        self.held = held

    def method(self) -> Any:
        return self.held


class Hostile:
    """Every attribute read raises ``error`` (``__dict__`` too)."""

    def __init__(self, error: BaseException) -> None:
        object.__setattr__(self, "_error", error)

    def __getattribute__(self, name: str) -> Any:
        if name in ("__class__",):
            return object.__getattribute__(self, name)
        raise object.__getattribute__(self, "_error")


class _RaisingMeta(type):
    @property
    def __module__(cls) -> str:  # type: ignore[override]
        raise asyncio.CancelledError


class ClassRaises(metaclass=_RaisingMeta):
    """A metaclass whose ``__module__`` raises ``CancelledError`` (the issue's case)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise asyncio.CancelledError


class Boom(BaseException):
    """An odd BaseException a user object might raise."""


class MutatingList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        self.append(0)  # changes itself while iterated
        return super().__iter__()


def hostile(kind: str) -> Any:
    if kind == "raise exception":
        return Hostile(RuntimeError("object is not bound"))
    if kind == "raise cancelled":
        return Hostile(asyncio.CancelledError())
    if kind == "raise base":
        return Hostile(Boom("odd"))
    if kind == "class raises":
        return ClassRaises()
    if kind == "mutating iter":
        return MutatingList([1, 2, 3])
    return list(range(reach.MAX_ITEMS + 50))  # huge: more than the walk reads


def wrap(kind: str, inner: Any, n: int) -> Any:
    """One link holding ``inner``. ``n`` makes names unique (class attributes, modules)."""
    if kind == "list":
        return [inner]
    if kind == "tuple":
        return (inner, 0)
    if kind == "dict":
        return {"k": inner}
    if kind == "defaultdict":
        d = collections.defaultdict(list)
        d["k"] = inner
        return d
    if kind == "ordereddict":
        return collections.OrderedDict(k=inner)
    if kind == "deque":
        return collections.deque([inner])
    if kind == "set":
        return {Hashable(inner)}
    if kind == "frozenset":
        return frozenset({Hashable(inner)})
    if kind == "instance":
        p = Plain()
        p.held = inner  # type: ignore[attr-defined]
        return p
    if kind == "slots":
        s = Slotted()
        s.held = inner
        return s
    if kind == "class":
        cls = type(f"Cls{n}", (), {"held": inner, "__module__": __name__})
        return cls()
    if kind == "dataclass":
        return Data(inner)
    if kind == "namedtuple":
        return Pair(inner, 0)
    if kind == "closure":
        held = inner

        def fn() -> Any:
            return held

        return fn
    if kind == "partial":
        return functools.partial(print, inner)
    if kind == "method":
        return Owner(inner).method
    if kind == "module_attr":
        m = torch.nn.Linear(1, 1)
        m.held = inner
        return m
    if kind == "user_module":
        mod = types.ModuleType(f"user_mod_{n}")
        mod.__file__ = f"/home/user/project/user_mod_{n}.py"
        mod.held = inner  # type: ignore[attr-defined]
        return mod
    raise ValueError(kind)


class Hashable:
    """A set's element: an object holding the next link (sets need hashable elements)."""

    def __init__(self, held: Any) -> None:
        self.held = held


def chain(choose: Choose, leaf: Any, *, max_depth: int = reach.MAX_DEPTH - 1) -> tuple[Any, list[str]]:
    """A random chain of links around ``leaf`` costing at most ``max_depth``; the kinds, outermost first."""
    kinds: list[str] = []
    budget = choose(list(range(0, max_depth + 1)))
    while True:
        options = [k for k, cost in LINKS.items() if cost + sum(LINKS[x] + _extra(x) for x in kinds) + _extra(k)
                   <= budget]
        if not options or (kinds and choose([True, False, False])):
            break
        kinds.append(choose(options))
    obj = leaf
    for i, kind in enumerate(reversed(kinds)):
        obj = wrap(kind, obj, id(obj) + i)
    return obj, kinds


def _extra(kind: str) -> int:
    return 1 if kind in ("set", "frozenset") else 0  # the element is an object holding the next link


def namespace(choose: Choose, planted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A notebook namespace: each planted object at the end of its own chain, some cycles, and
    hostile or huge siblings."""
    ns: dict[str, Any] = {}
    kinds = {}
    for name, leaf in planted.items():
        ns[name], kinds[name] = chain(choose, leaf)
        if choose([False, True]) and isinstance(ns[name], list):
            ns[name].append(ns[name])  # a cycle back to the root
    for i in range(choose([0, 1, 2, 3])):
        ns[f"odd{i}"] = hostile(choose(HOSTILE))
    if choose([False, True]):
        ns["everything"] = [ns[name] for name in planted]  # a second, longer path to each
    return ns, kinds


_TOKEN = re.compile(r"\.(?P<attr><[^>]*>|[A-Za-z_0-9]+)|\[(?P<key>[^\]]*)\]")


def resolve(ns: dict[str, Any], path: str) -> list[Any]:
    """The objects a walk's path leads to in ``ns`` (a set element may be any of its elements)."""
    if path.startswith("type("):
        end = _matching_paren(path)
        return _follow_all([type(x) for x in resolve(ns, path[5:end])], path[end + 1:])
    head = re.match(r"[A-Za-z_][A-Za-z_0-9]*", path)
    assert head, path
    return _follow_all([ns[head.group()]], path[head.end():])


def _follow_all(objs: list[Any], rest: str) -> list[Any]:
    while rest:
        tok = _TOKEN.match(rest)
        assert tok, rest
        rest = rest[tok.end():]
        objs = [y for obj in objs for y in _step(obj, tok)]
    return objs


def _step(obj: Any, tok: re.Match[str]) -> list[Any]:
    if tok["attr"] is not None:
        name = tok["attr"]
        if isinstance(obj, types.FunctionType) and name in obj.__code__.co_freevars:
            return [obj.__closure__[obj.__code__.co_freevars.index(name)].cell_contents]  # type: ignore[index]
        if isinstance(obj, types.ModuleType) or name.isidentifier():
            return [getattr(obj, name)]
        return [getattr(obj, name)]  # a module's numbered child: "0"
    key = tok["key"]
    if key.startswith("<element"):
        return list(obj)
    if isinstance(obj, functools.partial):
        raise AssertionError("partial paths use .args")
    return [obj[ast.literal_eval(key)]]


def reaches(ns: dict[str, Any], path: str, target: Any) -> bool:
    """Whether ``path`` leads to ``target``."""
    return any(o is target for o in resolve(ns, path))


def _matching_paren(path: str) -> int:
    depth = 0
    for i, ch in enumerate(path):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(path)
