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

import functools
import itertools
import sys
import types
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

ROLES = ("parameter", "gradient", "optimizer state", "other")
GROUP_TITLES = {
    "parameter": "parameters & buffers",
    "gradient": "gradients",
    "optimizer state": "optimizer state",
    "other": "activations / other",
}

# Names IPython (and the kernel) put in the user namespace.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})

_SHELL_MODULES = ("IPython.", "ipykernel.", "jupyter_client.", "zmq.", "traitlets.")

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


def _short_repr(value: Any, limit: int = 40) -> str:
    """A key's repr for a reference path: bounded, and never raising."""
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _top_name(path: str) -> str:
    """The variable a reference path starts at: ``model.fc[0].weight`` -> ``model``."""
    if " local " in path:
        return path
    for i, ch in enumerate(path):
        if ch in ".[{":
            return path[:i]
    return path


def _skip_name(name: str) -> bool:
    return name in _IPYTHON_NAMES or name.startswith("_")  # _, __, _5, _i3, _oh, _dh, __builtins__ ...


class _Walker:
    def __init__(self, torch: Any, devices: set[str] | None, max_depth: int, max_nodes: int,
                 observe: Callable[[Any, TensorEntry], None] | None = None) -> None:
        self.torch = torch
        self.observe = observe
        self.Tensor = torch.Tensor
        self.Module = torch.nn.Module
        self.Parameter = torch.nn.Parameter
        self.Optimizer = torch.optim.Optimizer
        self.devices = devices
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.nodes = 0
        self.truncated = False
        self.seen_objects: set[int] = set()
        self.seen_storages: set[tuple[str, int]] = set()
        self.entries: list[TensorEntry] = []
        self.param_names: dict[int, str] = {}  # id(param) -> first name
        self.optimizers: list[tuple[str, Any, str]] = []
        self.queue: deque[tuple[Any, str, int, str, str]] = deque()  # (object, name, depth, source, role)
        self.skipped: dict[str, None] = {}  # top names that could not be inspected, in order
        self.skipped_count = 0
        self.skipped_reason = ""

    def skip(self, path: str, exc: BaseException) -> None:
        name = _top_name(path)
        if name in self.skipped:
            return
        self.skipped_count += 1
        if len(self.skipped) < 20:
            self.skipped[name] = None
        if not self.skipped_reason:
            try:
                message = str(exc)
            except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
                message = ""
            self.skipped_reason = f"{type(exc).__name__}: {message[:120]}" if message else type(exc).__name__

    def is_module(self, obj: Any) -> bool:
        try:
            return isinstance(obj, self.Module)
        except BaseException:  # noqa: BLE001 (CancelledError too); a proxy whose __class__ raises: the walk skips it later
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
        except BaseException:  # noqa: BLE001 (CancelledError too); sparse, nested, fake or otherwise unusual tensors
            return
        if key in self.seen_storages or (key[1] == 0 and nbytes == 0):
            return
        self.seen_storages.add(key)
        entry = TensorEntry(name, nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), device, role, source,
                            key[1])
        self.entries.append(entry)
        if self.observe is not None:
            self.observe(t, entry)

    # -- generic walk --------------------------------------------------------------
    def visit(self, obj: Any, name: str, depth: int, source: str, role: str = "other") -> None:
        """Queue ``obj``; :meth:`drain` walks breadth-first, so the shortest name wins."""
        self.queue.append((obj, name, depth, source, role))

    def drain(self) -> None:
        while self.queue:
            item = self.queue.popleft()
            try:
                self._process(*item)
            except BaseException as exc:  # noqa: BLE001 (CancelledError too); a hostile object: skip that name, walk the rest
                self.skip(item[1], exc)

    def _process(self, obj: Any, name: str, depth: int, source: str, role: str = "other") -> None:
        if self.nodes >= self.max_nodes:
            self.truncated = True
            return
        self.nodes += 1
        if obj is None or isinstance(obj, (str, bytes, int, float, bool, complex, type, types.ModuleType,
                                             types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            return
        if isinstance(obj, self.Tensor):
            if id(obj) in self.seen_objects:
                return
            self.seen_objects.add(id(obj))
            is_param = isinstance(obj, self.Parameter)
            self.add_tensor(obj, name, "parameter" if is_param else role, source)
            if is_param:
                self.param_names.setdefault(id(obj), name)
            # Only leaves keep a .grad; reading it on a non-leaf makes torch warn in the user's output.
            grad = obj.grad if obj.is_leaf and (obj.requires_grad or is_param) else None
            if grad is not None:
                self.add_tensor(grad, name + ".grad", "gradient", source)
            return
        if id(obj) in self.seen_objects:
            return
        self.seen_objects.add(id(obj))
        if type(obj).__module__.startswith(_SHELL_MODULES):
            return  # the IPython shell, kernel, displayhook...: they lead back to the namespace
        if isinstance(obj, self.Module):
            self.visit_module(obj, name, source)
            return
        if isinstance(obj, self.Optimizer):
            self.optimizers.append((name, obj, source))
            return
        if depth >= self.max_depth:
            return
        if isinstance(obj, dict):
            for i, (k, v) in enumerate(list(itertools.islice(obj.items(), 10_001))):
                if i >= 10_000:
                    self.truncated = True
                    break
                self.visit(v, f"{name}[{_short_repr(k)}]", depth + 1, source, role)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(list(itertools.islice(obj, 10_001))):
                if i >= 10_000:
                    self.truncated = True
                    break
                self.visit(v, f"{name}[{i}]", depth + 1, source, role)
        elif isinstance(obj, (set, frozenset)):
            for i, v in enumerate(list(itertools.islice(obj, 10_001))):
                if i >= 10_000:
                    self.truncated = True
                    break
                self.visit(v, f"{name}{{item {i}}}", depth + 1, source, role)
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                for k, v in list(attrs.items()):
                    if isinstance(k, str):
                        self.visit(v, f"{name}.{k}", depth + 1, source, role)
            for slot in getattr(type(obj), "__slots__", ()) or ():
                if isinstance(slot, str) and hasattr(obj, slot):
                    self.visit(getattr(obj, slot, None), f"{name}.{slot}", depth + 1, source, role)

    def visit_module(self, module: Any, name: str, source: str) -> None:
        try:
            params = list(module.named_parameters(remove_duplicate=True))
            buffers = list(module.named_buffers(remove_duplicate=True))
        except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
            return
        for pname, p in params:
            full = f"{name}.{pname}"
            self.param_names.setdefault(id(p), full)
            self.seen_objects.add(id(p))
            self.add_tensor(p, full, "parameter", source)
            if p.grad is not None:
                self.add_tensor(p.grad, full + ".grad", "gradient", source)
        for bname, b in buffers:
            self.seen_objects.add(id(b))
            self.add_tensor(b, f"{name}.{bname}", "parameter", source)
        self.visit_hooks(module, name, source)

    def visit_hooks(self, module: Any, name: str, source: str) -> None:
        """What the hooks of ``module`` and its submodules keep: closure variables, a bound
        method's object, a callable object's attributes, a ``functools.partial``'s arguments."""
        for sub_name, sub in module.named_modules():
            for kind, attr in _HOOK_KINDS:
                hooks = getattr(sub, attr, None)
                if not isinstance(hooks, dict) or not hooks:
                    continue
                for hook in list(hooks.values())[:100]:
                    where = f"{name}.{sub_name}" if sub_name else name
                    label = f"{where}.<{kind} {getattr(hook, '__name__', type(hook).__name__)}>"
                    for var, value in _hook_holdings(hook):
                        self.visit(value, f"{label}.{var}" if var else label, 1, source)

    def finish_optimizers(self) -> None:
        for name, opt, source in self.optimizers:
            try:
                self._finish_optimizer(name, opt, source)
            except BaseException as exc:  # noqa: BLE001 (CancelledError too); an optimizer subclass with odd state
                self.skip(name, exc)
        self.optimizers.clear()

    def _finish_optimizer(self, name: str, opt: Any, source: str) -> None:
        try:
            groups = opt.param_groups
            state = opt.state
        except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
            return
        index = 0
        for group in groups:
            for p in group.get("params", ()):
                pname = self.param_names.get(id(p), f"param{index}")
                index += 1
                if id(p) not in self.seen_objects:  # parameters only the optimizer holds
                    self.seen_objects.add(id(p))
                    self.add_tensor(p, f"{name}.param_groups[{pname}]", "parameter", source)
                    if p.grad is not None:
                        self.add_tensor(p.grad, f"{name}.param_groups[{pname}].grad", "gradient", source)
                for key, value in (state.get(p) or {}).items():
                    if isinstance(value, self.Tensor):
                        self.add_tensor(value, f"{name}.state[{pname}].{key}", "optimizer state", source)


_HOOK_KINDS = (("forward hook", "_forward_hooks"), ("forward pre-hook", "_forward_pre_hooks"),
               ("backward hook", "_backward_hooks"), ("backward pre-hook", "_backward_pre_hooks"))


def _hook_holdings(hook: Any) -> list[tuple[str, Any]]:
    """(name, object) for what a hook keeps alive; "" names the hook object itself."""
    if isinstance(hook, functools.partial):
        return [(f"args[{i}]", a) for i, a in enumerate(hook.args)] + list(hook.keywords.items()) \
            + _hook_holdings(hook.func)
    if isinstance(hook, types.MethodType):
        return [(getattr(hook.__func__, "__name__", "method") + ".__self__", hook.__self__)]
    if isinstance(hook, types.FunctionType):
        cells = hook.__closure__ or ()
        out = []
        for var, cell in zip(hook.__code__.co_freevars, cells):
            try:
                out.append((var, cell.cell_contents))
            except ValueError:  # a cell not filled yet
                pass
        return out
    if isinstance(hook, (types.BuiltinFunctionType, type)):
        return []
    return [("", hook)]  # a callable object: its attributes


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
    max_depth: int = 4,
    max_nodes: int = 200_000,
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
    # Modules first, so optimizer state and gradients get the model's names.
    items = [(k, v) for k, v in list(ns.items()) if isinstance(k, str) and not _skip_name(k)]
    modules = [w.is_module(v) for _, v in items]
    for (key, value), is_module in zip(items, modules):
        if is_module:
            w.visit(value, key, 0, NAMESPACE)
    w.drain()
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
    entries = sorted(w.entries, key=lambda e: -e.nbytes)
    return Census(tuple(entries), w.truncated, tuple(w.skipped), w.skipped_count, w.skipped_reason)
