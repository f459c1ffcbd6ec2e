"""The monitor's energy and link traffic: the energy since it started (a line under the GPUs, and a
figure in each GPU's heading when there are several), and the link charts beside the host's
(PCIe host→GPU, PCIe GPU→host, NVLink where a GPU has active links), one line per GPU on a shared
scale with the link's limit dashed, the way nvdashboard draws all GPUs' PCIe in one chart. They sit
in the host's row, which has room for them: the monitor grows by no row of panels per GPU.

Data: ``GpuSeries.links``/``.energy`` and the link columns (analysis/monitor/traffic.py).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from gpunb.analysis.energy.tariff import Tariff
from gpunb.analysis.monitor.series import GpuSeries
from gpunb.analysis.monitor.traffic import LinkLimit
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL
from gpunb.views.sparkline import SparkPanel

# (column, title, what the alt text calls it, LinkLimits attribute)
_PCIE = (("pcie_rx_gbs", "PCIe host→GPU (GB/s)", "PCIe host to GPU", "pcie_rx"),
         ("pcie_tx_gbs", "PCIe GPU→host (GB/s)", "PCIe GPU to host", "pcie_tx"))


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def gpu_color(position: int, count: int) -> str:
    """One GPU's line colour in the link charts (a single GPU's line is teal, like the host's)."""
    return chart.TEAL if count == 1 else chart.SERIES_COLORS[position % len(chart.SERIES_COLORS)]


def _limit(limits: Sequence[LinkLimit]) -> tuple[float | None, str, str]:
    """(the dashed line's value, its legend words, its source) for GPUs whose limits may differ:
    one line at the highest, named as measured only when every GPU's was measured."""
    known = [x for x in limits if x.gbs]
    if not known:
        return None, "", limits[0].source if limits else ""
    top = max(known, key=lambda x: x.gbs or 0.0)
    words = "measured peak" if all(x.measured for x in known) else "datasheet peak" \
        if not any(x.measured for x in known) else "peak"
    sources = sorted({x.source for x in known})
    return top.gbs, words, "; ".join(sources)


def gpu_key(gpus: Sequence[GpuSeries]) -> str:
    """The GPUs' colours in the link charts, for the row's heading (no line of its own: the
    monitor is tall enough); '' for one GPU."""
    shown = [g for g in gpus if g.links is not None]
    if len(shown) < 2:
        return ""
    items = [(gpu_color(i, len(shown)), f"GPU {g.index}", False) for i, g in enumerate(shown)]
    return f'<span style="{SMALL};{DIM}">{chart.legend(items)}</span>'


def _panel(panel: SparkPanel, gpus: Sequence[GpuSeries], column: str, title: str, label: str,
           limits: Sequence[LinkLimit], colors: dict[int, str]) -> str:
    series = [(f"gpu{g.index}_{column}", colors[g.index], f"GPU {g.index}") for g in gpus]
    limit, words, source = _limit(limits)
    legend = (f'<span title="{_e(source)}">{chart.legend([(chart.RED, words, True)])}</span>' if limit else
              f'<span style="{DIM}" title="{_e(source)}">no limit known</span>')
    return panel.multi_line(series, label=label, unit="GB/s", title=title, threshold=limit,
                            threshold_words=f"{words} ({source})", legend=legend, aggregate="max",
                            aggregate_words="busiest GPU")


def link_panels(panel: SparkPanel, gpus: Sequence[GpuSeries]) -> list[str]:
    """PCIe host→GPU and GPU→host of every shown GPU, and NVLink (received: over NVLink what one
    GPU sends another receives) of the GPUs with active links; none where links are not read."""
    shown = [g for g in gpus if g.links is not None and f"gpu{g.index}_pcie_rx_gbs" in panel.tracks]
    if not shown:
        return []
    colors = {g.index: gpu_color(i, len(shown)) for i, g in enumerate(shown)}  # as gpu_key() names them
    out = [_panel(panel, shown, column, title, label, [getattr(g.links, attr) for g in shown], colors)
           for column, title, label, attr in _PCIE]
    linked = [g for g in shown if g.links is not None and g.links.nvlink is not None]
    if linked:
        out.append(_panel(panel, linked, "nvlink_rx_gbs", "NVLink received (GB/s)", "NVLink received",
                          [g.links.nvlink for g in linked if g.links is not None and g.links.nvlink is not None],
                          colors))
    return out


# -- energy ----------------------------------------------------------------------------

def wh_words(wh: float) -> str:
    if wh >= 10_000:
        return f"{wh / 1000:,.1f} kWh"
    if wh >= 100:
        return f"{wh:,.0f} Wh"
    return f"{wh:.1f} Wh" if wh >= 10 else f"{wh:.2f} Wh"


def duration_words(seconds: float) -> str:
    """'1 h 12 min', '12 min 5 s', '42 s'."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{s} s"


def _co2_words(grams: float) -> str:
    return f"{grams / 1000:,.2f} kg CO₂" if grams >= 1000 else f"{grams:,.0f} g CO₂" if grams >= 10 else \
        f"{grams:.1f} g CO₂"


def energy_words(gpus: Sequence[GpuSeries], tariff: Tariff | None, started_unix: float | None,
                 power_now_w: float | None) -> str:
    """'Energy: 41.2 Wh since 14:02 (1 h 12 min), 0.62 kW now' (summed over ``gpus``), with the
    cost and CO₂ only when the user named a price or a carbon intensity; '' before any reading."""
    got = [g.energy for g in gpus if g.energy is not None]
    if not got:
        return ""
    wh = sum(e.wh for e in got)
    since = min(e.since_s for e in got)
    span = max(e.until_s for e in got) - since
    clock = time.strftime("%H:%M", time.localtime(started_unix + since)) if started_unix is not None else ""
    on = f" on {len(got)} GPUs" if len(got) > 1 else ""
    words = f"Energy: {wh_words(wh)}{on} since {clock} ({duration_words(span)})" if clock else \
        f"Energy: {wh_words(wh)}{on} in {duration_words(span)}"
    if power_now_w is not None:
        words += f", {power_now_w / 1000:.2f} kW now"
    if tariff is not None and not tariff.empty:
        extra = [tariff.spent_words(wh)]
        co2 = tariff.co2_g(wh)
        if co2 is not None:
            extra.append(_co2_words(co2))
        words += "".join(f" · {x}" for x in extra if x)
    estimated = [e.index for e in got if e.estimated]
    if estimated and len(estimated) == len(got):
        words += " · estimated from the power readings (no energy counter)"
    elif estimated:
        words += f" · GPU {', '.join(map(str, estimated))} estimated from the power readings (no energy counter)"
    return words


def energy_html(words: str) -> str:
    if not words:
        return ""
    head, _, rest = words.partition(": ")
    return (f'<div class="gpunb-energy" style="margin:2px 0 4px 0"><b>{_e(head)}</b> '
            f'{_e(rest)}</div>')


def gpu_energy_badge(g: GpuSeries, several: bool) -> str:
    """The GPU's own energy in its heading, when the monitor shows several GPUs ('' for one: the
    energy line says it)."""
    e = g.energy
    if not several or e is None:
        return ""
    tip = "energy since the monitor started, " + ("estimated from the power readings" if e.estimated else
                                                   "from the GPU's energy counter")
    return f'<span style="{SMALL};{DIM}" title="{_e(tip)}">{_e(wh_words(e.wh))}</span>'


def power_now(gpus: Sequence[GpuSeries], latest: dict | None = None) -> float | None:
    """The shown GPUs' latest power summed (W); ``latest`` is a panel's latest values, else the
    series' own columns."""
    total, any_ = 0.0, False
    for g in gpus:
        if latest is not None:
            w = latest.get(f"gpu{g.index}_power_w")
        else:
            w = next((v for v in reversed(g.columns.get("power_w", [])) if v is not None), None)
        if w is not None:
            total, any_ = total + w, True
    return total if any_ else None


def links_text(g: GpuSeries) -> str:
    """' · PCIe in 57.7 / out 0.1 GB/s · NVLink in 410 GB/s' for the text form ('' without links)."""
    if g.links is None:
        return ""

    def latest(name: str) -> str:
        v = next((v for v in reversed(g.columns.get(name, [])) if v is not None), None)
        return "n/a" if v is None else f"{v:,.1f}"

    out = f" · PCIe in {latest('pcie_rx_gbs')} / out {latest('pcie_tx_gbs')} GB/s"
    if g.links.nvlink is not None:
        out += f" · NVLink in {latest('nvlink_rx_gbs')} / out {latest('nvlink_tx_gbs')} GB/s"
    return out
