"""One display base for gpunb's result objects (in the spirit of rich's ``JupyterMixin``).

Records do not know their views. A view module registers how it renders a record type
(:func:`register_views`: mimetype -> function of the record, ``text/plain`` always), and the
base looks that up (:func:`views_for`) when the record is shown. The base turns it into
everything a frontend or a script asks for: ``_repr_mimebundle_`` honouring IPython's
``include`` and ``exclude``, ``str()``/``print()`` and ``_repr_pretty_`` giving the text view,
and a JSON-safe ``to_dict()`` built from the dataclass fields.

This module sits below every layer (like ``units.py``), so ``analysis`` builds on it without
importing ``views`` at all. Who loads the views: the package's ``__init__`` adds a loader
(:func:`add_view_loader`) that imports ``gpunb.views`` the first time a record is shown
(``tests/test_import_layers.py`` holds the layers to this).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Collection, Mapping, Set
from os import PathLike
from typing import Any, ClassVar

Render = Callable[[Any], Any]  # record -> the data for one mimetype (None: not available this time)

_VIEWS: dict[type, dict[str, Render]] = {}  # record type -> mimetype -> renderer, filled by gpunb.views
_FIGURES: dict[type, Render] = {}  # record type -> its matplotlib figure, where a view draws one
_LOADERS: list[Callable[[], object]] = []  # run once, the first time a record finds no view


def register_views(record_type: type, views: Mapping[str, Render], *, figure: Render | None = None) -> None:
    """How ``record_type`` (and its subclasses) is shown; called by the view modules."""
    if "text/plain" not in views:
        raise ValueError(f"the views of {record_type.__name__} need text/plain")
    _VIEWS[record_type] = dict(views)
    if figure is not None:
        _FIGURES[record_type] = figure


def add_view_loader(load: Callable[[], object]) -> None:
    """``load`` registers the views (imports them); it runs when a record first needs one."""
    _LOADERS.append(load)


def _lookup(table: Mapping[type, Any], record_type: type) -> Any:
    for _ in range(2):
        for cls in record_type.__mro__:
            if cls in table:
                return table[cls]
        while _LOADERS:  # first miss: import the views, then look again
            _LOADERS.pop(0)()
    return None


def views_for(record: Any) -> Mapping[str, Render]:
    """mimetype -> renderer registered for ``record``'s type (or a base of it)."""
    views = _lookup(_VIEWS, type(record))
    if views is None:
        raise NotImplementedError(f"no view is registered for {type(record).__name__} (gpunb.display.register_views)")
    return views


def figure_for(record: Any) -> Any:
    """The matplotlib Figure a view draws of ``record`` (imports matplotlib only then)."""
    draw = _lookup(_FIGURES, type(record))
    if draw is None:
        raise NotImplementedError(f"no figure is registered for {type(record).__name__}")
    return draw(record)


class DisplayMixin:
    """Display and plain data for a result record; its views are registered by ``gpunb.views``."""

    # Derived values (properties) that ``to_dict`` adds after the dataclass fields.
    _dict_extras: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # IPython's pretty printer walks the MRO and stops at the first class that defines
        # __repr__, which @dataclass writes into every record: so each record carries the
        # text-view printer in its own namespace, where it is found first.
        if "_repr_pretty_" not in cls.__dict__:
            cls._repr_pretty_ = DisplayMixin._repr_pretty_  # type: ignore[method-assign]

    def _repr_views_(self) -> Mapping[str, Render]:
        """mimetype -> renderer; ``text/plain`` is required. The registered views by default; an
        object of the shells layer (which may import views) can name its own."""
        return views_for(self)

    def _repr_mimebundle_(self, include: Collection[str] | None = None,
                          exclude: Collection[str] | None = None) -> dict[str, Any]:
        # Only the mimetypes asked for are rendered: a figure is not drawn when text was wanted.
        bundle = {}
        for mimetype, render in self._repr_views_().items():
            if (include and mimetype not in include) or (exclude and mimetype in exclude):
                continue
            data = render(self)
            if data is not None:
                bundle[mimetype] = data
        return bundle

    def __str__(self) -> str:
        return str(self._repr_views_()["text/plain"](self))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"{type(self).__name__}(...)" if cycle else str(self))

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data that ``json.dumps`` accepts (see :func:`jsonable`)."""
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__} is not a dataclass: it must define to_dict() itself")
        out = {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out.update((name, jsonable(getattr(self, name))) for name in self._dict_extras)
        return out


def jsonable(value: Any) -> Any:
    """``value`` as JSON-safe data: records through their own ``to_dict``, else their fields
    (a record that only says how it reads, like an ``Unavailable`` NVML reading, as its
    string); mappings with string keys, tuples/lists/sets as lists, bytes decoded, non-finite
    floats as None, anything else (a path, an enum's value) as its string."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return jsonable(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if type(value).__str__ is not object.__str__:  # a value with its own words (Unavailable)
            return str(value)
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Set):
        items = list(value)
        try:
            items.sort()  # a stable order for output that gets compared or diffed
        except TypeError:
            pass
        return [jsonable(v) for v in items]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, PathLike):
        return str(value)
    return str(value)
