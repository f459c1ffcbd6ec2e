"""Pieces the memory views share: sizes in GiB/MiB, a plain HTML table, the tensor rows.

Every dynamic string goes through ``html.escape``: tensor names come from the user's
variables and process names from other users.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpunb.analysis.memory.census import GROUP_TITLES, NAMESPACE, ROLES
from gpunb.units import gib

GiB = 2**30


def size(n: Any) -> str:
    return gib(int(n) if isinstance(n, float) else n, digits=2)


_STYLE = ("font-family:var(--jp-code-font-family,monospace);font-size:12px;border-collapse:collapse")
# The report around the table wraps long paths anywhere; inside the table that would shrink each
# column to one character and break words ("floa/t32" at 1024 px). Cells break only between
# words (break-word leaves the column's minimum width at its longest word), and a table wider
# than the output scrolls sideways in its own box instead.
_TD = ("padding:1px 8px;text-align:left;border-bottom:1px solid rgba(140,149,159,0.35);"
       "overflow-wrap:break-word;word-break:normal")


def table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='{_TD}'>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='{_TD}'>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div style='overflow-x:auto'><table style='{_STYLE}'><tr>{head}</tr>{body}</table></div>"


def holder(source: str) -> str:
    """Who keeps a tensor alive, in the user's words (the census says "namespace")."""
    return "a variable" if source == NAMESPACE else source


def tensor_rows(entries: Any, top: int) -> list[list[str]]:
    return [[e.name, size(e.nbytes), "×".join(map(str, e.shape)) or "scalar", e.dtype, e.device, e.role,
             holder(e.source)] for e in list(entries)[:top]]


TENSOR_HEAD = ["reference", "size", "shape", "dtype", "device", "role", "kept by"]


def group_lines(census: Any) -> list[str]:
    by = census.by_role()
    return [f"{GROUP_TITLES[r]}: {size(by[r])}" for r in ROLES if by.get(r)]
