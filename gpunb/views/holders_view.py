"""Who holds a GPU's memory, as one short block under that GPU's charts (HTML) or indented
lines (text). The lines come from :mod:`gpunb.analysis.holders.server`; notebook paths and
process names in them are other people's words, so every one is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

TITLE = "GPU memory held by"


def holders_html(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    items = " · ".join(f"<span>{escape(line)}</span>" for line in lines)
    return (f'<div class="gpunb-holders" style="font-size:11px;margin:0 0 4px 0">'
            f"<b>{TITLE}:</b> {items}</div>")


def holders_text(lines: Sequence[str]) -> list[str]:
    return [f"  {TITLE}: " + "; ".join(lines)] if lines else []
