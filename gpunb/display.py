"""One display base for gpunb's result objects (in the spirit of rich's ``JupyterMixin``).

A result record says which view renders it, in :meth:`DisplayMixin._repr_views_`: a mapping
from mimetype to a function of the record (``text/plain`` always, ``text/html`` and others
such as ``image/png`` when the view has them). The base turns that into everything a
frontend or a script asks for: ``_repr_mimebundle_`` honouring IPython's ``include`` and
``exclude``, ``str()``/``print()`` and ``_repr_pretty_`` giving the text view, and a
JSON-safe ``to_dict()`` built from the dataclass fields.

This module sits below every layer (like ``units.py``): records in ``analysis`` build on
it without importing from ``views``. Each record imports its view lazily, inside
``_repr_views_``; README "Design" states that rule and ``tests/test_import_layers.py``
holds the package to it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Collection, Mapping, Set
from os import PathLike
from typing import Any, ClassVar

Render = Callable[[Any], Any]  # record -> the data for one mimetype (None: not available this time)


class DisplayMixin:
    """Display and plain data for a result record; subclasses define :meth:`_repr_views_`."""

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
        """mimetype -> renderer; ``text/plain`` is required. Import the view module here,
        lazily: views sit above the records they render."""
        raise NotImplementedError(f"{type(self).__name__} names no view (define _repr_views_)")

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
