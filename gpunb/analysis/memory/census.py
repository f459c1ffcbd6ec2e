"""Name the live tensors by what keeps them alive in a notebook.

The walk starts at the user namespace (``shell.user_ns``; IPython's own names skipped)
and follows modules (``named_parameters``, ``named_buffers``, ``.grad``), optimizers
(``optimizer.state[p]`` named after the parameter: ``opt.state[model.fc.weight].exp_avg``),
dicts, lists, tuples and object attributes, to a bounded depth. Then it looks at the
places that keep tensors alive without a name: the output history (``Out[3]``), the last
exception's frames, and any other tracebacks given. Each storage is counted once (views
share storage), under the first name found for it.

A module's hooks are looked into too (what a forward hook's closure, bound object or
``functools.partial`` keeps: ``model.fc1.<forward hook save>.store[3]``), since storing
activations from a hook is a common way to keep every step's tensors alive.

Works for tensors on any device (CPU too, which is how it is tested in CI); pass
``devices={"cuda"}`` to keep only GPU tensors.

A notebook namespace holds objects that are not ours to trust: proxies whose
``__class__`` raises while unbound (werkzeug's ``LocalProxy``), containers whose
``items()`` or ``__iter__`` raise, properties that raise. Such a name is skipped and
counted (``Census.names_skipped``); the walk goes on with the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis import reach

ROLES = ("parameter", "gradient", "optimizer state", "other")
GROUP_TITLES = {
    "parameter": "parameters & buffers",
    "gradient": "gradients",
    "optimizer state": "optimizer state",
    "other": "activations / other",
}

# Names IPython (and the kernel) put in the user namespace.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})

NAMESPACE = "namespace"
OUTPUT_HISTORY = "output history"
EXCEPTION = "failed cell"


@dataclass(frozen=True)
class TensorEntry:
    name: str  # the reference path: "model.fc.weight.grad", "Out[3]", "train() local x"
    nbytes: int  # of the storage (counted once)
    shape: tuple[int, ...]
    dtype: str
    device: str
    role: str  # one of ROLES
    source: str  # NAMESPACE | OUTPUT_HISTORY | EXCEPTION | caller's label
    address: int = field(default=0, compare=False)  # the storage's data_ptr: matches allocator blocks

    @property
    def leftover(self) -> bool:
        return self.source != NAMESPACE

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nbytes": self.nbytes,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "role": self.role,
            "source": self.source,
        }


@dataclass(frozen=True)
class Census:
    entries: tuple[TensorEntry, ...]  # largest first
    truncated: bool = False  # the walk hit its node bound
    names_skipped: tuple[str, ...] = field(default_factory=tuple)  # could not be inspected (first 20 kept)
    skipped_count: int = 0
    skipped_reason: str = ""  # the first error met, e.g. "RuntimeError: object is not bound"

    def skipped_note(self) -> str:
        """"3 names skipped (could not be inspected: u, d, l; RuntimeError: ...)", or ""."""
        if not self.skipped_count:
            return ""
        names = ", ".join(self.names_skipped[:8]) + (", …" if self.skipped_count > 8 else "")
        noun = "name" if self.skipped_count == 1 else "names"
        return (f"{self.skipped_count} {noun} skipped (could not be inspected: {names}; "
                f"{self.skipped_reason}); tensors they hold are not counted")

    def total_bytes(self, *, role: str | None = None, source: str | None = None, device: str | None = None) -> int:
        return sum(
            e.nbytes for e in self.entries
            if (role is None or e.role == role) and (source is None or e.source == source)
            and (device is None or e.device == device)
        )

    def by_role(self) -> dict[str, int]:
        return {r: self.total_bytes(role=r) for r in ROLES}

    @property
    def leftovers(self) -> tuple[TensorEntry, ...]:
        return tuple(e for e in self.entries if e.leftover)

    def find(self, name: str) -> TensorEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entries": [e.to_dict() for e in self.entries],
            "by_role": self.by_role(),
            "leftover_bytes": sum(e.nbytes for e in self.leftovers),
            "truncated": self.truncated,
            "names_skipped": list(self.names_skipped),
            "skipped_count": self.skipped_count,
        }


_short_repr = reach.safe_repr


def _top_name(path: str) -> str:
    """The variable a reference path starts at: ``model.fc[0].weight`` -> ``model``."""
    if " local " in path:
        return path
    for i, ch in enumerate(path):
        if ch in ".[{(":
            return path[:i]
    return path


def _skip_name(name: str) -> bool:
    return name in _IPYTHON_NAMES or name.startswith("_")  # _, __, _5, _i3, _oh, _dh, __builtins__ ...


class _Walker:
    """The census's use of the shared walk (:mod:`gpunb.analysis.reach`): tensors are counted
    (each storage once), modules named by their parameters, buffers, attributes and hooks, and
    optimizers' state named after the parameters, once the modules gave them names."""

    def __init__(self, torch: Any, devices: set[str] | None, max_depth: int, max_nodes: int,
                 observe: Callable[[Any, TensorEntry], None] | None = None) -> None:
        self.torch = torch
        self.observe = observe
        self.Tensor = torch.Tensor
        self.Module = torch.nn.Module
        self.Parameter = torch.nn.Parameter
        self.Optimizer = torch.optim.Optimizer
        self.devices = devices
        self.walk = reach.Walk(max_depth=max_depth, max_nodes=max_nodes)
        self.seen_storages: set[tuple[str, int]] = set()
        self.entries: list[TensorEntry] = []
        self.param_names: dict[int, str] = {}  # id(param) -> first name
        self.optimizers: list[tuple[str, Any, str]] = []

    def is_module(self, obj: Any) -> bool:
        try:
            return isinstance(obj, self.Module)
        except BaseException as exc:  # noqa: BLE001 (CancelledError too); a proxy whose __class__ raises
            if reach.passes(exc):
                raise
            return False

    # -- tensors -----------------------------------------------------------------
    def add_tensor(self, t: Any, name: str, role: str, source: str) -> None:
        try:
            device = str(t.device)
            if device == "meta":
                return
            if self.devices is not None and t.device.type not in self.devices:
                return
            storage = t.untyped_storage()
            key = (device, storage.data_ptr())
            nbytes = int(storage.nbytes())
        except BaseException as exc:  # noqa: BLE001 (CancelledError too); sparse, nested, fake or odd tensors
            if reach.passes(exc):
                raise
            return
        if key in self.seen_storages or (key[1] == 0 and nbytes == 0):
            return
        self.seen_storages.add(key)
        entry = TensorEntry(name, nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), device, role, source,
                            key[1])
        self.entries.append(entry)
        if self.observe is not None:
            self.observe(t, entry)

    # -- the walk ------------------------------------------------------------------
    def visit(self, obj: Any, name: str, depth: int, source: str, role: str = "other") -> None:
        """Queue ``obj``; :meth:`drain` walks breadth-first, so the shortest name wins."""
        self.walk.add(obj, name, depth, (source, role))

    def drain(self) -> None:
        self.walk.run(self._process)

    def _process(self, obj: Any, name: str, depth: int, tag: tuple[str, str]) -> bool:
        source, role = tag
        if isinstance(obj, self.Tensor):
            is_param = isinstance(obj, self.Parameter)
            self.add_tensor(obj, name, "parameter" if is_param else role, source)
            if is_param:
                self.param_names.setdefault(id(obj), name)
            # Only leaves keep a .grad; reading it on a non-leaf makes torch warn in the user's output.
            grad = obj.grad if obj.is_leaf and (obj.requires_grad or is_param) else None
            if grad is not None:
                self.add_tensor(grad, name + ".grad", "gradient", source)
            return False
        if isinstance(obj, self.Module):
            self.visit_module(obj, name, depth, source)
            return False
        if isinstance(obj, self.Optimizer):
            self.optimizers.append((name, obj, source))
            return False
        return True

    def visit_module(self, module: Any, name: str, depth: int, source: str) -> None:
        params = list(module.named_parameters(remove_duplicate=True))
        buffers = list(module.named_buffers(remove_duplicate=True))
        for sub in module.modules():
            if sub is not module:
                self.walk.mark(sub)
        for pname, p in params:
            full = f"{name}.{pname}"
            self.param_names.setdefault(id(p), full)
            self.walk.mark(p)
            self.add_tensor(p, full, "parameter", source)
            if p.grad is not None:
                self.add_tensor(p.grad, full + ".grad", "gradient", source)
        for bname, b in buffers:
            self.walk.mark(b)
            self.add_tensor(b, f"{name}.{bname}", "parameter", source)
        for path, value in reach.module_attributes(module, name):  # attributes, then what hooks keep
            self.visit(value, path, depth + 1, source)

    def finish_optimizers(self) -> None:
        for name, opt, source in self.optimizers:
            try:
                self._finish_optimizer(name, opt, source)
            except BaseException as exc:  # noqa: BLE001 (CancelledError too); an optimizer subclass with odd state
                if reach.passes(exc):
                    raise
                self.walk.skip(name, exc)
        self.optimizers.clear()

    def _finish_optimizer(self, name: str, opt: Any, source: str) -> None:
        groups = opt.param_groups
        state = opt.state
        index = 0
        for group in groups:
            for p in group.get("params", ()):
                pname = self.param_names.get(id(p), f"param{index}")
                index += 1
                if not self.walk.seen(p):  # parameters only the optimizer holds
                    self.walk.mark(p)
                    self.add_tensor(p, f"{name}.param_groups[{pname}]", "parameter", source)
                    if p.grad is not None:
                        self.add_tensor(p.grad, f"{name}.param_groups[{pname}].grad", "gradient", source)
                for key, value in (state.get(p) or {}).items():
                    if isinstance(value, self.Tensor):
                        self.add_tensor(value, f"{name}.state[{pname}].{key}", "optimizer state", source)

    def census(self) -> Census:
        w = self.walk
        entries = sorted(self.entries, key=lambda e: -e.nbytes)
        reason = next(iter(w.skipped.values()), "")
        return Census(tuple(entries), w.truncated, tuple(w.skipped), w.skipped_count, reason)


def _frames(tb: Any) -> Iterable[tuple[str, dict[str, Any]]]:
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        if code.co_name != "<module>" and "IPython" not in code.co_filename:  # module-level = the namespace
            try:
                yield code.co_name, dict(frame.f_locals)
            except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
                pass
        tb = tb.tb_next


def exception_holders(exc: BaseException | None) -> list[tuple[str, dict[str, Any]]]:
    """``(function, locals)`` for every frame an exception (and its chain) keeps alive."""
    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.extend(_frames(e.__traceback__))
        todo.extend([e.__cause__, e.__context__])
    return out


def take_census(
    namespace: dict[str, Any] | None,
    *,
    torch: Any = None,
    devices: set[str] | None = None,
    output_history: dict[int, Any] | None = None,
    exceptions: Iterable[tuple[str, BaseException | None]] = (),
    max_depth: int = reach.MAX_DEPTH,
    max_nodes: int = reach.MAX_NODES,
    observe: Callable[[Any, TensorEntry], None] | None = None,
) -> Census:
    """Name every tensor reachable from ``namespace``, then the unnamed holders.

    ``exceptions``: ``(label, exc)`` pairs whose frames are searched after the namespace
    (e.g. ``("failed cell", exc)``, ``("sys.last_value", ...)``); their tensors are
    reported with ``source=label``. ``observe(tensor, entry)``, when given, is called for each
    tensor counted (the leak finder reads its autograd history there).
    """
    torch = torch if torch is not None else sys.modules.get("torch")
    if torch is None:
        return Census(())
    w = _Walker(torch, devices, max_depth, max_nodes, observe)
    ns = namespace or {}
    # Modules first, so optimizer state and gradients get the model's names; every name queued
    # before the walk starts, so a name of the notebook wins over a path to it (a hook's global).
    items = [(k, v) for k, v in list(ns.items()) if isinstance(k, str) and not _skip_name(k)]
    modules = [w.is_module(v) for _, v in items]
    for (key, value), is_module in zip(items, modules):
        if is_module:
            w.visit(value, key, 0, NAMESPACE)
    for (key, value), is_module in zip(items, modules):
        if not is_module:
            w.visit(value, key, 0, NAMESPACE)
    w.drain()
    w.finish_optimizers()
    history = [(n, v) for n, v in list((output_history or {}).items()) if isinstance(n, int)]
    for n, value in sorted(history, key=lambda kv: kv[0]):
        w.visit(value, f"Out[{n}]", 0, OUTPUT_HISTORY)
    w.drain()
    w.finish_optimizers()
    for label, exc in exceptions:
        for fn, local_vars in exception_holders(exc):
            for var, value in local_vars.items():
                w.visit(value, f"{fn}() local {var}", 1, label)
        w.drain()
        w.finish_optimizers()
    return w.census()
