"""The monitor's overview for several GPUs: one panel per metric with a line per GPU (the GPUs'
colours named once, as the link charts do) and a compact table of each GPU's values now and its
energy, so eight GPUs fit one screen; each GPU's own panels are one click away in a ``<details>``.

Why: a block of five panels per GPU made the monitor 2,628 px tall with eight GPUs in JupyterLab
at 1366×768 (docs/outputs.md). The per-GPU lines reuse the tracks' formatted points
(:meth:`SparkPanel.multi_line`), so the overview adds string joins, not formatting.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from gpunb.analysis.monitor.series import GpuSeries
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL
from gpunb.views.imbalance_view import imbalance_badge
from gpunb.views.links_view import gpu_color, wh_words
from gpunb.views.per_gpu import gpu_span
from gpunb.views.sparkline import SparkPanel

_WRAP = "display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start"
_CELL = "padding:0 8px 0 0;text-align:right;white-space:nowrap"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def overview_colors(gpus: Sequence[GpuSeries]) -> dict[int, str]:
    """Each GPU's line colour in the overview (the link charts use the same: links_view.gpu_color)."""
    return {g.index: gpu_color(i, len(gpus)) for i, g in enumerate(gpus)}


def overview_panels(panel: SparkPanel, gpus: Sequence[GpuSeries], colors: dict[int, str]) -> list[str]:
    """Memory used, utilization, power, temperature and SM clock, a line per GPU on one per-GPU
    scale, each with one large number on that scale, its aggregate named in the title (the totals
    over GPUs are the table's and the energy line's: a sum is no point on a per-GPU axis)."""
    def series(column: str) -> list[tuple[str, str, str]]:
        return [(f"gpu{g.index}_{column}", colors[g.index], f"GPU {g.index}") for g in gpus]

    limits = [g.power_limit_w for g in gpus if g.power_limit_w]
    slowdowns = [s for g in gpus if (s := panel.slowdown_c.get(g.index))]
    power_limit = max(limits) if limits else None
    slowdown = min(slowdowns) if slowdowns else None
    limit = chart.legend([(chart.RED, "limit", True)]) if power_limit else ""
    slow = chart.legend([(chart.RED, "slowdown", True)]) if slowdown else ""
    return [
        panel.multi_line(series("mem_used_mib"), label="GPU memory used", unit="GiB", title="memory (GiB)",
                         scale=1 / 1024, aggregate="max", aggregate_words="fullest GPU"),
        panel.multi_line(series("util_pct"), label="GPU utilization", unit="%", title="utilization (%)",
                         digits=0, aggregate="mean", aggregate_words="mean of GPUs"),
        panel.multi_line(series("power_w"), label="GPU power", unit="W", title="power (W)", digits=0,
                         threshold=power_limit, threshold_words="power limit", legend=limit, aggregate="max",
                         aggregate_words="highest GPU"),
        panel.multi_line(series("temp_c"), label="GPU temperature", unit="°C", title="temperature (°C)",
                         digits=0, threshold=slowdown, threshold_words="slowdown at", legend=slow, aggregate="max",
                         aggregate_words="hottest GPU"),
        panel.multi_line(series("sm_clock_mhz"), label="GPU SM clock", unit="MHz", title="SM clock (MHz)",
                         digits=0, aggregate="min", aggregate_words="slowest GPU"),
    ]


def _now(panel: SparkPanel, g: GpuSeries, column: str) -> Any:
    return panel.latest.get(f"gpu{g.index}_{column}")


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def gpu_table(panel: SparkPanel, gpus: Sequence[GpuSeries], colors: dict[int, str], badges: dict[int, str],
              imbalance: Sequence[Any] = ()) -> str:
    """A row per GPU: its colour, the values now, its energy since the start, its badges (a badge
    every GPU shows is said once above the table: shared_badge)."""
    if shared_badge(badges, gpus):
        badges = {}
    head = "".join(f'<th style="{_CELL};font-weight:600">{_e(h)}</th>' for h in (
        "GPU", "util %", "memory GiB", "this kernel", "power W", "°C", "SM MHz", "energy"))
    rows = []
    for g in gpus:
        used, own = _now(panel, g, "mem_used_mib"), _now(panel, g, "mem_own_mib")
        total = f" / {g.memory_total_mib / 1024:.0f}" if g.memory_total_mib else ""
        mem = "n/a" if used is None else f"{used / 1024:.1f}{total}"
        power = _num(_now(panel, g, "power_w"))
        energy = "" if g.energy is None else wh_words(g.energy.wh) + (" (est.)" if g.energy.estimated else "")
        state = ('<span style="color:#e0413a;font-weight:bold">lost (no readings)</span>' if g.lost else "")
        flags = " ".join(b for b in (state, badges.get(g.index, ""), imbalance_badge(imbalance, g.index)) if b)
        cells = [
            f'{chart.swatch(colors[g.index])} <b>{g.index}</b>',
            _num(_now(panel, g, "util_pct")),
            mem,
            "n/a" if own is None else f"{own / 1024:.1f}",
            power + (f" / {g.power_limit_w:.0f}" if g.power_limit_w and power != "n/a" else ""),
            _num(_now(panel, g, "temp_c")),
            _num(_now(panel, g, "sm_clock_mhz")),
            _e(energy),
        ]
        tds = "".join(f'<td style="{_CELL}">{c}</td>' for c in cells)
        rows.append(f'<tr class="gpunb-gpu-row">{tds}<td style="padding:0;text-align:left">{flags}</td></tr>')
    rows.append(_sum_row(panel, gpus))
    return (f'<table class="gpunb-gpu-table" style="border-collapse:collapse;font-size:11px;line-height:1.35;'
            f'margin:2px 0;font-variant-numeric:tabular-nums"><thead><tr>{head}<th style="padding:0"></th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{_unknown_own_note(panel, gpus)}')


def _unknown_own_note(panel: SparkPanel, gpus: Sequence[GpuSeries]) -> str:
    """Why "this kernel" reads n/a for some GPUs beside numbers for others: their process list
    was not read (NVML gave none, or not yet); '' when the column is all known or all unknown."""
    unknown = [g.index for g in gpus if _now(panel, g, "mem_used_mib") is not None
               and _now(panel, g, "mem_own_mib") is None]
    if not unknown or len(unknown) == len(gpus):
        return ""
    which = gpu_span(unknown)
    return (f'<div class="gpunb-own-unknown" style="{SMALL};{DIM};margin:0 0 2px 0">this kernel n/a on {_e(which)}: '
            "NVML did not say which processes hold its memory at the last look (asked again every 5 s)</div>")


def _sum(values: Sequence[float | None]) -> float | None:
    """The sum when every value is known (a partial sum would read as the whole), else None."""
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def _sum_row(panel: SparkPanel, gpus: Sequence[GpuSeries]) -> str:
    """The GPUs' totals now, under their rows: the sums the charts do not draw (their lines and
    large numbers are per GPU)."""
    used = _sum([_now(panel, g, "mem_used_mib") for g in gpus])
    own = _sum([_now(panel, g, "mem_own_mib") for g in gpus])
    power = _sum([_now(panel, g, "power_w") for g in gpus])
    capacity = _sum([g.memory_total_mib for g in gpus])
    limits = _sum([g.power_limit_w for g in gpus])
    mem = "n/a" if used is None else f"{used / 1024:,.1f}" + (f" / {capacity / 1024:,.0f}" if capacity else "")
    watts = "n/a" if power is None else f"{power:,.0f}" + (f" / {limits:,.0f}" if limits else "")
    cells = ["<b>sum</b>", "", mem, "n/a" if own is None else f"{own / 1024:,.1f}", watts, "", "", ""]
    tds = "".join(f'<td style="{_CELL};border-top:1px solid rgba(140,149,159,0.5)">{c}</td>' for c in cells)
    return f'<tr class="gpunb-gpu-sum">{tds}<td style="padding:0"></td></tr>'


def _visible(badge: str) -> str:
    """A badge's words without its tooltip (each GPU's tip gives its own share of the window)."""
    return re.sub(r' title="[^"]*"', "", badge)


def shared_badge(badges: dict[int, str], gpus: Sequence[GpuSeries]) -> str:
    """The badge when every GPU shows the same one (eight "power cap" badges are one fact), else ''."""
    shown = {_visible(badges.get(g.index, "")) for g in gpus}
    if len(gpus) < 2 or len(shown) != 1 or not next(iter(shown)):
        return ""
    return badges[gpus[0].index]


def overview_html(panel: SparkPanel, gpus: Sequence[GpuSeries], *, badges: dict[int, str], per_gpu: str,
                  imbalance: Sequence[Any] = (), how: str = "details") -> str:
    """The overview block: a heading with the GPUs' names and colours, the metric panels, the
    table, then ``per_gpu`` (each GPU's own blocks) in a ``<details>`` (``how`` "open": opened),
    or with ``how`` "button" a line naming the live monitor's button that shows them. (A live
    frame replaces the output, which would shut an open ``<details>`` at every redraw, so the
    live monitor opens it with a button, and skips drawing the blocks while it is off.)"""
    colors = overview_colors(gpus)
    names = sorted({g.name for g in gpus})
    title = f"{len(gpus)} × {names[0]}" if len(names) == 1 else ", ".join(names)
    key = chart.legend([(colors[g.index], f"GPU {g.index}", False) for g in gpus])
    heading = (f'<div style="margin:2px 0"><b style="font-size:13px">GPUs</b> <span style="{DIM}">{_e(title)}'
               f'</span> <span style="{SMALL};{DIM}">{key}</span></div>')
    body = f'<div style="{_WRAP}">{"".join(overview_panels(panel, gpus, colors))}</div>'
    what = f"each GPU's charts ({len(gpus)} GPUs, memory split by process)"
    if how == "button":
        details = (f'<div class="gpunb-per-gpu" style="{SMALL};{DIM};margin:2px 0">{_e(what)}: the running '
                   'monitor\'s "Each GPU" button; in this output once the monitor stops</div>')
    else:
        details = (f'<details class="gpunb-per-gpu"{" open" if how == "open" else ""} style="margin:2px 0">'
                   f'<summary style="cursor:pointer;{SMALL}">{_e(what)}</summary>{per_gpu}</details>')
    common = shared_badge(badges, gpus)
    if common:
        every = "both GPUs" if len(gpus) == 2 else f"all {len(gpus)} GPUs"
        common = f'<div class="gpunb-shared-badge" style="margin:2px 0;{SMALL}">{_e(every)}: {common}</div>'
    return (f'<div class="gpunb-overview">{heading}{body}{common}{gpu_table(panel, gpus, colors, badges, imbalance)}'
            f'{details}</div>')
