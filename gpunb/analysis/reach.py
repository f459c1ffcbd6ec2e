"""One walk over what a notebook (or a training step) can reach, shared by every reader of the
user's objects: the census behind ``%gpumem`` and the OOM doctor, the leak finder's looks and
``%gpufit``'s save/restore. Each asks the walk for what it needs; none walks by itself.

The walk goes breadth first (the shortest path names an object) from named roots: a notebook's
namespace, or a step function (:func:`step_roots`: its closure, defaults, ``functools.partial``
arguments, bound ``self``, the globals its code names). From each object it follows
(:func:`edges`):

- built-in containers: list, tuple, dict, set, frozenset, ``deque``, ``defaultdict``,
  ``OrderedDict`` (their subclasses too), namedtuples and dataclasses (as objects);
- an instance's ``__dict__`` and ``__slots__``, and its class when the user wrote it
  (``type(trainer).cache``); a class's own attributes (``Trainer.cache``);
- functions (closure cells, defaults, and the globals their code names when those globals
  belong to the user), bound methods (``__self__``, ``__func__``), ``functools.partial``;
- module objects the user made or imported from their own files; an installed package's or
  the standard library's module (torch's caches are not the user's) is a leaf.

What a caller does with an object (count a tensor, save a module) is its ``visit`` callback;
it may stop the walk going further into that object and queue edges of its own (a module's
parameters by their names).

The budget lives here, once: a node limit (``truncated`` when hit), a depth limit, at most
``max_items`` elements per container (``truncated`` too), cycle safety (each object once, by
id, kept alive for the walk), and the guard: every read of a user object runs inside
``try/except BaseException`` (a property raising ``asyncio.CancelledError``, a proxy whose
``__class__`` raises, a mutating ``__iter__``); the holder is skipped and named in
``skipped``, the walk goes on. ``KeyboardInterrupt`` and ``SystemExit`` pass: they are the
user's Ctrl-C and exit, not an object's fault.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import os
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

MAX_DEPTH = 8
MAX_NODES = 200_000
MAX_ITEMS = 10_000  # elements read per container

# Reads of a user object that end the walk rather than skip the object: none. A KeyboardInterrupt
# or SystemExit out of an attribute read is that object's doing as often as the user's (an object
# raising it must not break the census: tests/test_fault_base_exceptions.py); the walk is bounded
# (its budget), so a Ctrl-C that lands inside a read is taken as that object's failure, and the next
# one, outside the walk, stops the cell.
PASS_THROUGH: tuple[type[BaseException], ...] = ()

_ATOMS = (str, bytes, bytearray, int, float, bool, complex, type(None), range, memoryview)
# outside the guard, atoms are told by their exact type: isinstance() reads ``__class__``, which
# a user object may make raise
_ATOM_TYPES = frozenset(_ATOMS)
_SHELL_MODULES = ("IPython.", "ipykernel.", "jupyter_client.", "zmq.", "traitlets.", "gpunb.")
# A class's own entries that never lead to user data.
_CLASS_SKIP = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__slots__", "__annotations__",
                         "__qualname__", "__firstlineno__", "__static_attributes__", "__orig_bases__",
                         "__parameters__", "__match_args__", "__dataclass_fields__", "__dataclass_params__"})


def passes(exc: BaseException) -> bool:
    """Whether a guard must let ``exc`` go on (the user's Ctrl-C or exit)."""
    return isinstance(exc, PASS_THROUGH)


def safe_repr(value: Any, limit: int = 40) -> str:
    """A key's repr for a path: bounded, and never raising (``KeyboardInterrupt`` aside)."""
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError
    except BaseException as exc:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
        if passes(exc):
            raise
        text = f"<{safe_type_name(value)}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _key(k: Any) -> str:
    """A dict key as a path shows it: ``'preds'``, ``3``; other keys through :func:`safe_repr`."""
    if type(k) is str and len(k) <= 38:
        return repr(k)
    return str(k) if type(k) is int else safe_repr(k)


def safe_type_name(value: Any) -> str:
    try:
        name = type(value).__name__
        return name if isinstance(name, str) else "object"
    except BaseException as exc:  # noqa: BLE001 (a metaclass may raise anything)
        if passes(exc):
            raise
        return "object"


# -- whose module is it -----------------------------------------------------------------------
def _library_dirs() -> tuple[str, ...]:
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
        except (KeyError, OSError):
            pass
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        dirs.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs if d))


_LIBRARY_DIRS = _library_dirs()
_USER_FILE_CACHE: dict[str, bool] = {}


def is_user_file(path: str) -> bool:
    """A file the user wrote: not in the standard library, site-packages or dist-packages."""
    known = _USER_FILE_CACHE.get(path)
    if known is None:
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        known = not ("site-packages" in parts or "dist-packages" in parts or real.startswith(_LIBRARY_DIRS))
        if len(_USER_FILE_CACHE) < 10_000:
            _USER_FILE_CACHE[path] = known
    return known


def is_user_module(module: types.ModuleType) -> bool:
    """The user made it (``__main__``, a notebook's module) or imported it from their own files;
    never gpunb's own or IPython's."""
    name = module.__dict__.get("__name__")
    if not isinstance(name, str) or name.startswith(_SHELL_MODULES) or name == "gpunb":
        return False
    if name == "__main__":
        return True
    path = module.__dict__.get("__file__")
    return isinstance(path, str) and is_user_file(path)


def _module_of(obj: Any) -> str:
    name = obj.__module__  # a metaclass may raise here: the caller's guard skips the object
    return name if isinstance(name, str) else ""


def is_user_class(cls: type) -> bool:
    """A class the user wrote: defined in ``__main__`` or in a module of theirs."""
    name = cls.__dict__.get("__module__")
    if not isinstance(name, str):
        return False
    if name == "__main__":
        return True
    module = sys.modules.get(name)
    return isinstance(module, types.ModuleType) and is_user_module(module)


# -- the edges of one object ------------------------------------------------------------------
def _items(obj: Iterable[Any], limit: int) -> tuple[list[Any], bool]:
    """Up to ``limit`` elements, and whether there were more. A mutating ``__iter__`` (one that
    changes the container while it runs) raises inside the caller's guard."""
    got = list(itertools.islice(obj, limit + 1))
    return got[:limit], len(got) > limit


def _function_edges(fn: types.FunctionType, user_globals: bool) -> Iterator[tuple[str, Any]]:
    code = fn.__code__
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield f".{var}", cell.cell_contents  # as the code names it
        except ValueError:  # a cell not filled yet
            pass
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f".__defaults__[{i}]", value
    for key, value in (fn.__kwdefaults__ or {}).items():
        yield f".__kwdefaults__[{key!r}]", value
    if user_globals and users_globals(fn.__globals__):
        glob = fn.__globals__
        for name in dict.fromkeys(global_names(code)):
            if name in glob:
                yield f".<global {name}>", glob[name]


def users_globals(glob: dict[str, Any]) -> bool:
    """Whether a function's globals are the user's: the notebook's (``__main__``, or a namespace
    without a module name) or a module of their own; never an installed package's."""
    name = glob.get("__name__")
    if name == "__main__" or not isinstance(name, str):
        return True
    module = sys.modules.get(name)
    return isinstance(module, types.ModuleType) and is_user_module(module)


def global_names(code: types.CodeType) -> Iterator[str]:
    """The global names a code object (and the functions and comprehensions inside it) names."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from global_names(const)


def edges(obj: Any, *, max_items: int = MAX_ITEMS, function_globals: bool = True) -> tuple[list[tuple[str, Any]], bool]:
    """``(path suffix, child)`` for what ``obj`` holds, and whether some were left out
    (``max_items``). Raises what the object raises: the walk's guard handles it."""
    out: list[tuple[str, Any]] = []
    more = False
    if isinstance(obj, _ATOMS):
        return out, more
    if isinstance(obj, dict):  # dict, defaultdict, OrderedDict, and their subclasses
        pairs, more = _items(obj.items(), max_items)
        out = [(f"[{_key(k)}]", v) for k, v in pairs if type(v) not in _ATOM_TYPES]  # atoms hold nothing
        if isinstance(obj, collections.defaultdict) and obj.default_factory is not None:
            out.append((".default_factory", obj.default_factory))
        if type(obj) in (dict, collections.defaultdict, collections.OrderedDict):
            return out, more
    elif isinstance(obj, (list, tuple, collections.deque)):
        if type(obj) is list or type(obj) is tuple:  # C slicing: no iterator of the user's to run
            values, more = list(obj[:max_items]), len(obj) > max_items
        else:
            values, more = _items(obj, max_items)
        fields = getattr(type(obj), "_fields", None) if isinstance(obj, tuple) else None
        if isinstance(fields, tuple) and len(fields) == len(values):  # a namedtuple: by its field names
            out = [(f".{f}", v) for f, v in zip(fields, values)]
        else:
            out = [(f"[{i}]", v) for i, v in enumerate(values) if type(v) not in _ATOM_TYPES]
        if type(obj) in (list, tuple, collections.deque) or fields:
            return out, more
    elif isinstance(obj, (set, frozenset)):
        values, more = _items(obj, max_items)
        out = [(f"[<element {i}>]", v) for i, v in enumerate(values)]
        if type(obj) in (set, frozenset):
            return out, more
    elif isinstance(obj, types.ModuleType):
        if is_user_module(obj):
            pairs, more = _items(obj.__dict__.items(), max_items)
            out = [(f".{k}", v) for k, v in pairs if isinstance(k, str) and not k.startswith("__")]
        return out, more
    elif isinstance(obj, type):
        if is_user_class(obj):
            for k, v in list(obj.__dict__.items())[:max_items]:
                if isinstance(k, str) and k not in _CLASS_SKIP:
                    out.append((f".{k}", v.__func__ if isinstance(v, (staticmethod, classmethod)) else v))
        return out, more
    elif isinstance(obj, types.FunctionType):
        return list(_function_edges(obj, function_globals)), more
    elif isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__), (".__func__", obj.__func__)], more
    elif isinstance(obj, functools.partial):
        out = [(f".args[{i}]", a) for i, a in enumerate(obj.args)]
        out += [(f".keywords[{k!r}]", v) for k, v in obj.keywords.items()]
        out.append((".func", obj.func))
        return out, more
    elif isinstance(obj, (types.BuiltinFunctionType, types.CodeType, types.FrameType, types.GeneratorType,
                          types.CoroutineType, types.TracebackType)):
        return out, more
    # an object: its attributes and slots, and its class when the user wrote it
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        pairs, cut = _items(attrs.items(), max_items)
        more = more or cut
        out += [(f".{k}", v) for k, v in pairs if type(v) not in _ATOM_TYPES and isinstance(k, str)]
    slots, users = _class_facts(type(obj))
    for slot in slots:
        try:
            out.append((f".{slot}", getattr(obj, slot)))
        except AttributeError:  # an empty slot
            pass
    if users:
        out.append(("type({})", type(obj)))  # formatted by the walk: "type(trainer)"
    return out, more


# weak keys: a class the notebook redefined (and its class attributes' tensors) must not stay alive here
_CLASS_FACTS: weakref.WeakKeyDictionary[type, tuple[tuple[str, ...], bool]] = weakref.WeakKeyDictionary()


def _class_facts(cls: type) -> tuple[tuple[str, ...], bool]:
    """A class's slots (its bases' too) and whether the user wrote it, cached per class
    (a notebook holds thousands of instances of a few classes)."""
    facts = _CLASS_FACTS.get(cls)
    if facts is None:
        declared = [klass.__dict__.get("__slots__", ()) or () for klass in cls.__mro__]
        slots = tuple(slot for names in declared for slot in ((names,) if isinstance(names, str) else names)
                      if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"))
        facts = (slots, is_user_class(cls))
        if len(_CLASS_FACTS) < 10_000:
            _CLASS_FACTS[cls] = facts
    return facts


def join(path: str, suffix: str) -> str:
    return suffix.format(path) if suffix.startswith("type(") else path + suffix


# -- the walk ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Walk:
    """A breadth-first walk with one budget. :meth:`add` queues roots, :meth:`run` walks them.

    ``visit(obj, path, depth, tag)`` is called once per object; it returns True to let the walk
    follow :func:`edges` of ``obj`` (queued with the same ``tag``), False to stop there (it may
    :meth:`add` edges of its own). Atoms (numbers, strings) are never visited."""

    max_depth: int = MAX_DEPTH
    max_nodes: int = MAX_NODES
    max_items: int = MAX_ITEMS
    function_globals: bool = True
    nodes: int = 0
    truncated: bool = False
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # path -> "ErrorType: message" (first 20)
    skipped_count: int = 0
    _seen: dict[int, Any] = dataclasses.field(default_factory=dict)  # id -> object, kept so ids stay unique
    _queue: collections.deque[tuple[Any, str, int, Any]] = dataclasses.field(default_factory=collections.deque)

    def seen(self, obj: Any) -> bool:
        return id(obj) in self._seen

    def mark(self, obj: Any) -> None:
        self._seen[id(obj)] = obj

    def add(self, obj: Any, path: str, depth: int = 0, tag: Any = None) -> None:
        if type(obj) in _ATOM_TYPES or id(obj) in self._seen:
            return
        self._queue.append((obj, path, depth, tag))

    def skip(self, path: str, exc: BaseException) -> None:
        self.skipped_count += 1
        if len(self.skipped) < 20:
            try:
                message = str(exc)[:120]
            except BaseException as err:  # noqa: BLE001 (an exception's __str__ may raise too)
                if passes(err):
                    raise
                message = ""
            self.skipped[path] = f"{type(exc).__name__}: {message}" if message else type(exc).__name__

    def run(self, visit: Callable[[Any, str, int, Any], bool]) -> None:
        queue, seen, atoms, shell = self._queue, self._seen, _ATOM_TYPES, _shell_type
        max_nodes, max_depth, max_items, globals_too = self.max_nodes, self.max_depth, self.max_items, \
            self.function_globals
        while queue:
            obj, path, depth, tag = queue.popleft()
            if id(obj) in seen:
                continue
            if self.nodes >= max_nodes:
                self.truncated = True
                queue.clear()
                return
            self.nodes += 1
            seen[id(obj)] = obj
            try:
                if shell(type(obj)):
                    continue  # the IPython shell, kernel, displayhook: they lead back to the namespace
                if not visit(obj, path, depth, tag) or depth >= max_depth:
                    continue
                children, more = edges(obj, max_items=max_items, function_globals=globals_too)
            except BaseException as exc:  # noqa: BLE001 (a hostile object: skip it, walk the rest)
                if passes(exc):
                    raise
                self.skip(path, exc)
                continue
            if more:
                self.truncated = True
            depth += 1
            for suffix, child in children:
                if type(child) not in atoms and id(child) not in seen:
                    queue.append((child, suffix.format(path) if suffix[:5] == "type(" else path + suffix, depth, tag))


_SHELL_TYPES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _shell_type(cls: type) -> bool:
    """Whether objects of ``cls`` belong to the IPython shell or kernel (cached per class)."""
    known = _SHELL_TYPES.get(cls)
    if known is None:
        module = cls.__module__  # a metaclass may raise here: the walk's guard skips the object
        known = isinstance(module, str) and module.startswith(_SHELL_MODULES[:-1])
        if len(_SHELL_TYPES) < 10_000:
            _SHELL_TYPES[cls] = known
    return known


def step_roots(step_fn: Any) -> list[tuple[str, Any]]:
    """What a training step reaches directly, named: the step itself, then (through the walk's
    edges) its bound ``self``, ``functools.partial`` arguments, closure, defaults and the globals
    its code names. A callable object's ``__call__`` is added, so the globals it names count."""
    name = "step"
    try:
        qual = getattr(step_fn, "__name__", None)
        if isinstance(qual, str) and qual.isidentifier():
            name = qual
    except BaseException as exc:  # noqa: BLE001 (a hostile callable)
        if passes(exc):
            raise
    roots: list[tuple[str, Any]] = [(name, step_fn)]
    try:
        call = type(step_fn).__dict__.get("__call__")
        if isinstance(call, types.FunctionType):
            roots.append((f"type({name}).__call__", call))
    except BaseException as exc:  # noqa: BLE001 (a hostile callable)
        if passes(exc):
            raise
    return roots


# -- torch's holders, by the names a user knows them by ----------------------------------------
HOOK_KINDS = (("forward hook", "_forward_hooks"), ("forward pre-hook", "_forward_pre_hooks"),
              ("backward hook", "_backward_hooks"), ("backward pre-hook", "_backward_pre_hooks"))
# an nn.Module's own bookkeeping (parameters, buffers and submodules are named by torch's
# named_* methods; the hook dicts by HOOK_KINDS)
MODULE_INTERNALS = frozenset({
    "_backward_hooks", "_backward_pre_hooks", "_buffers", "_forward_hooks", "_forward_hooks_always_called",
    "_forward_hooks_with_kwargs", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_is_full_backward_hook",
    "_load_state_dict_post_hooks", "_load_state_dict_pre_hooks", "_modules", "_non_persistent_buffers_set",
    "_parameters", "_state_dict_hooks", "_state_dict_pre_hooks", "training", "_compiled_call_impl"})


def module_attributes(module: Any, name: str) -> list[tuple[str, Any]]:
    """``(path, value)`` for what a module and its submodules keep besides parameters, buffers
    and submodules (``model.layers.2.cache``: a list attribute), then what their hooks keep
    (``model.fc1.<forward hook save>``: the hook; the walk follows its closure and ``self``)."""
    out: list[tuple[str, Any]] = []
    hooks: list[tuple[str, Any]] = []
    for sub_name, sub in module.named_modules(remove_duplicate=True):
        where = f"{name}.{sub_name}" if sub_name else name
        for key, value in list(vars(sub).items())[:MAX_ITEMS]:
            if isinstance(key, str) and key not in MODULE_INTERNALS:
                out.append((f"{where}.{key}", value))
        for kind, attr in HOOK_KINDS:
            table = sub.__dict__.get(attr)
            if isinstance(table, dict):
                for hook in list(table.values())[:100]:
                    hooks.append((f"{where}.<{kind} {_callable_name(hook)}>", hook))
    return out + hooks


def _callable_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        inner = getattr(fn, "func", None)  # functools.partial
        name = getattr(inner, "__name__", None)
    return name if isinstance(name, str) else safe_type_name(fn)
