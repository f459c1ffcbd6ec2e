"""The monitor's finding of unbalanced GPUs (``analysis/monitor/imbalance.py``): one line above the
charts, in HTML and text, and a badge in the label of each GPU it names (the monitor draws
its badges in ``monitor_layout.gpu_heading``, beside the throttle badge). Kept apart from the chart
views so that the monitor's layout and this finding can change on their own."""

from __future__ import annotations

import html
from collections.abc import Sequence

from gpunb.analysis.monitor.imbalance import ADVICE, Imbalance

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


_BADGE = {"idle": "unbalanced: idle", "utilization": "unbalanced: utilization", "memory": "unbalanced: memory"}


def imbalance_badge(findings: Sequence[Imbalance], index: int) -> str:
    """The badge in GPU ``index``'s label when a finding names it ('' otherwise); the finding's
    words and the likely causes in the tooltip."""
    named = [f for f in findings if index in getattr(f, "gpus", ())]
    if not named:
        return ""
    words = "; ".join(f"{f.text} — likely: {ADVICE.get(f.kind, '')}" for f in named)
    label = " · ".join(dict.fromkeys(_BADGE.get(f.kind, "unbalanced") for f in named))
    return (f'<span class="gpunb-badge gpunb-imbalance-badge" title="{html.escape(words, quote=True)}" '
            'style="display:inline-block;padding:0 5px;border-radius:8px;border:1px solid #b35900;'
            f'color:#b35900;font-size:10px;white-space:nowrap">{html.escape(label)}</span>')
