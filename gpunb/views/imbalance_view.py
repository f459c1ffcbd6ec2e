"""The monitor's line for unbalanced GPUs (``analysis/imbalance.py``): one badge-like line
above the charts, in HTML and text. Kept apart from the chart views so that the monitor's
layout and this finding can change on their own."""

from __future__ import annotations

import html
from typing import Sequence

from gpunb.analysis.imbalance import ADVICE, Imbalance

_TITLE = {"idle": "idle GPU", "utilization": "uneven utilization", "memory": "uneven memory"}


def imbalance_text(findings: Sequence[Imbalance]) -> list[str]:
    return [f"unbalanced GPUs ({_TITLE.get(f.kind, f.kind)}): {f.text} — likely: {ADVICE.get(f.kind, '')}"
            for f in findings]


def imbalance_html(findings: Sequence[Imbalance]) -> str:
    """'' when balanced; else one line per finding, the likely causes in the tooltip."""
    if not findings:
        return ""
    rows = "".join(
        f'<div title="likely: {html.escape(ADVICE.get(f.kind, ""), quote=True)}">'
        f'<b>unbalanced GPUs</b> ({html.escape(_TITLE.get(f.kind, f.kind))}): {html.escape(f.text)}</div>'
        for f in findings)
    return ('<div class="gpunb-imbalance" style="font-family:sans-serif;font-size:12px;margin:4px 0;'
            'padding:2px 8px;border-left:3px solid #b35900;color:#b35900">' + rows + "</div>")
