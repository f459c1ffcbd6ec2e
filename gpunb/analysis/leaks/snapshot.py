"""One look at what the notebook's variables hold, counted per container.

The census (:func:`gpunb.analysis.memory.census.take_census`) names every tensor by its
reference path (``running_preds[12]``, ``model.fc1.<forward hook save>.store[3]``). A leak is a
container that gains an element every step, so each tensor is counted under every container
on its path (``logs['preds'][3]`` counts for ``logs`` and ``logs['preds']``); the finder later
keeps the deepest one that grows.

A tensor with autograd history (a ``grad_fn``) keeps its step's graph alive. The graph of a
tensor that is no container's element (a variable, an attribute) is walked
(``next_functions``, shared between tensors, capped at :data:`GRAPH_NODE_CAP` nodes per look)
to count its nodes. That is how ``total_loss += loss`` shows: one tensor whose graph gains
nodes every step.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis import reach
from gpunb.analysis.memory.census import NAMESPACE, TensorEntry, take_census

GRAPH_NODE_CAP = 20_000  # autograd nodes walked per look (~1 µs each on the CPU of the H200 machine)
CENSUS_NODE_CAP = 100_000  # objects the census visits per look (its default is 200,000)


@dataclass
class Holding:
    """What one container (or one top-level tensor variable) holds at one look."""

    tensors: int = 0
    nbytes: int = 0  # the tensors' own storages
    with_history: int = 0  # tensors with a grad_fn
    graph_nodes: int = 0  # autograd nodes first reached from its tensors
    sample: tuple[Any, ...] = ()  # (shape, dtype, grad_fn type) of the last tensor counted
    graph_inputs: frozenset[int] = frozenset()  # ids of the nodes its last tensor's grad_fn feeds from
    graph_input_kinds: frozenset[str] = frozenset()  # and their types (``NllLossBackward0``)


@dataclass
class Snapshot:
    step: int  # 0-based index of the step that had just ended
    t: float  # clock at the look
    cost_s: float  # the look's own time
    holdings: dict[str, Holding] = field(default_factory=dict)
    tensor_bytes: int = 0  # every tensor the census found
    graph_capped: bool = False
    census_capped: bool = False
    # top-level tensor variables: name -> ((shape, dtype, grad_fn type), id of its grad_fn or 0)
    variables: dict[str, tuple[tuple[Any, ...], int]] = field(default_factory=dict)
    skipped_note: str = ""  # holders the census could not read (an object raising): not counted


_MARKS = re.compile(r"[\[\]'\"]")  # the only characters containers() needs to look at


def containers(path: str) -> list[str]:
    """The containers on a reference path, outermost first, ending with the path itself:
    ``logs['preds'][3]`` -> ``logs``, ``logs['preds']``, ``logs['preds'][3]``. A ``[`` inside a
    key's quotes does not count. Called for every tensor of every look: only brackets and
    quotes are visited."""
    if "[" not in path:
        return [path]
    out = []
    depth, quote = 0, ""
    for m in _MARKS.finditer(path):
        ch, i = m.group(), m.start()
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            if depth:
                quote = ch
        elif ch == "[":
            if depth == 0 and i:
                out.append(path[:i])
            depth += 1
        else:  # "]"
            depth = max(depth - 1, 0)
    out.append(path)
    return out


class _GraphWalk:
    """The autograd graph behind the tensors of one look, each node counted once.

    Only nodes are counted, never the tensors they saved for backward: reading one runs the
    saved-tensor unpack hooks (activation checkpointing would recompute the forward there,
    ``save_on_cpu`` would copy it back to the GPU), and one freed by ``.backward()`` raises an
    exception that costs ~28 µs. The bytes a leak holds come from the census and, on a GPU,
    from torch's allocated bytes."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        # id -> node, the node kept: a Python wrapper of an autograd node may be made afresh at
        # each ``next_functions`` read and freed after, and a freed object's id is soon another's
        self.seen: dict[int, Any] = {}
        self.capped = False

    def walk(self, fn: Any) -> int:
        """Nodes first reached from ``fn``."""
        nodes = 0
        todo = [fn]
        while todo:
            node = todo.pop()
            if node is None or id(node) in self.seen:
                continue
            if len(self.seen) >= self.cap:
                self.capped = True
                break
            self.seen[id(node)] = node
            nodes += 1
            try:
                todo.extend(n for n, _ in node.next_functions)
            except Exception:  # noqa: BLE001 (a custom Function's odd node: its inputs stay unseen)
                pass
        return nodes


def _users(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The namespace without gpunb's own objects (``p`` of ``with gpunb.profile() as p``, the
    records of earlier cells): the running profile's timelines gain points every step, and
    walking them made each look cost milliseconds, so too few fitted the budget."""
    out = {}
    for name, value in list(namespace.items()):
        try:
            module = getattr(type(value), "__module__", "") or ""  # a metaclass may raise here
        except BaseException as exc:  # noqa: BLE001 (CancelledError too): the census skips it and says so
            if reach.passes(exc):
                raise
            module = ""
        if not (isinstance(module, str) and (module == "gpunb" or module.startswith("gpunb."))):
            out[name] = value
    return out


def look(namespace: Mapping[str, Any], torch: Any, step: int, *, devices: set[str] | None = None,
         clock: Callable[[], float] = time.perf_counter, graph_cap: int = GRAPH_NODE_CAP) -> Snapshot:
    """Count what the namespace's variables hold, per container, at the end of ``step``."""
    t0 = clock()
    graph = _GraphWalk(graph_cap)
    holdings: dict[str, Holding] = {}
    variables: dict[str, tuple[tuple[Any, ...], int]] = {}
    keep: list[Any] = []  # the autograd nodes whose ids this look records

    def observe(tensor: Any, entry: TensorEntry) -> None:
        if entry.source != NAMESPACE or entry.role != "other":
            return  # parameters, gradients and optimizer state are not what grows per step
        fn = tensor.grad_fn
        paths = containers(entry.name)
        # only a tensor that is no container's element gets its graph walked: a list's elements
        # are counted (with_history), which is what tells that leak, at a fraction of the cost
        nodes = graph.walk(fn) if fn is not None and len(paths) == 1 else 0
        sample = (entry.shape, entry.dtype, type(fn).__name__ if fn is not None else "")
        if fn is not None:
            keep.append(fn)
        if len(paths) == 1 and entry.name.isidentifier():
            variables[entry.name] = (sample, id(fn) if fn is not None else 0)
        for name in paths:
            h = holdings.get(name)
            if h is None:
                h = holdings[name] = Holding()
            h.tensors += 1
            h.nbytes += entry.nbytes
            h.with_history += fn is not None
            h.graph_nodes += nodes
            h.sample = sample
            if len(paths) == 1 and fn is not None:
                inputs = [n for n, _ in fn.next_functions if n is not None]
                keep.extend(inputs)  # alive until the look ends, so their ids stay theirs
                h.graph_inputs = frozenset(id(n) for n in inputs)
                h.graph_input_kinds = frozenset(type(n).__name__ for n in inputs)

    # The collector is held off while the census allocates: a full collection of a notebook's heap
    # (~320k objects with torch and IPython: 0.25-0.29 s on the CI machine) fell inside a look now and
    # then, and its time, counted as the look's, spent the finder's budget on one look. The
    # collection still runs, at the loop's next allocations, as it would have without the look.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        census = take_census(_users(namespace), torch=torch, devices=devices, max_nodes=CENSUS_NODE_CAP,
                             observe=observe)
    finally:
        if was_enabled:  # a user's gc.disable() stays theirs
            gc.enable()
    return Snapshot(step, t0, clock() - t0, holdings, census.total_bytes(), graph.capped, census.truncated,
                    variables, census.skipped_note())
