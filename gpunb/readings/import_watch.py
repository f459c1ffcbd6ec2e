"""Be told when a module finishes importing, without importing it.

A training cell very often starts with ``import torch``: a profiler that only looks at
``sys.modules`` when the cell begins would miss every hook of that cell. :func:`when_imported`
puts a finder at the front of ``sys.meta_path`` that, for the one module name it watches,
lets the normal finders locate the module and wraps the loader they return, so the callback
runs right after the module's own code has finished (for ``torch``: after ``torch.optim``
and ``torch.utils.data`` exist, because ``torch/__init__.py`` imports them).

The watch costs one string comparison per import of another module; it fires at most once
and :meth:`ImportWatch.remove` takes it out again. The module keeps its real loader: it is
put back on ``__loader__`` and ``__spec__.loader`` as soon as the module has run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


class _NotifyingLoader(Loader):
    """The real loader, plus a call to the watch once the module has run without error."""

    def __init__(self, loader: Any, watch: ImportWatch) -> None:
        self._loader = loader
        self._watch = watch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # Tools that look at a module's loader (importlib.resources, inspect) see the real one.
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        self._watch._fire(module)

    def __getattr__(self, name: str) -> Any:  # get_code, is_package, get_resource_reader, ...
        return getattr(self._loader, name)


class ImportWatch(MetaPathFinder):
    """Calls ``callback(module)`` once, after ``name`` has been imported; see :func:`when_imported`."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self.fired = False
        self._lock = threading.Lock()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name or self.fired:
            return None
        spec: ModuleSpec | None = None
        for finder in list(sys.meta_path):  # the finders after us decide where the module is
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def _fire(self, module: ModuleType) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        self.remove()
        try:
            self.callback(module)
        except Exception:  # the watcher's trouble must never break the user's import
            pass

    def remove(self) -> None:
        """Stop watching (idempotent)."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> ImportWatch:
    """Call ``callback(module)`` once the top-level module ``name`` has been imported by
    anyone in this process. The caller checks ``sys.modules`` first: a module already
    imported is not imported again, so the watch would never fire."""
    watch = ImportWatch(name, callback)
    sys.meta_path.insert(0, watch)
    return watch
