"""The monitor's layout: a block per GPU (its name and badges, then five panels that wrap onto
the next line in a narrow window instead of being cut off), who holds its memory, the host,
notes and a caption; and the text form for terminals and ``text/plain``.

The panels themselves (charts, scales, values) are :class:`gpunb.views.sparkline.SparkPanel`'s.
Panels have fixed widths, so the GPUs' panels line up under each other when they fit on one
line, like nvitop's one screen and a row of Grafana panels; flex-wrap keeps every value
readable at 1024 px with JupyterLab's file browser open. Every dynamic string is escaped.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpunb.analysis.energy.tariff import Tariff
from gpunb.analysis.machine import read_state, without_gpu
from gpunb.analysis.monitor.series import GpuSeries, Window
from gpunb.readings.gpu import CLOCK_EVENT_REASONS, SLOWDOWN_BITS
from gpunb.readings.test_hooks import fake_note
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL
from gpunb.views.holders_view import holders_html, holders_text
from gpunb.views.imbalance_view import imbalance_badge, imbalance_html
from gpunb.views.links_view import (
    energy_html,
    energy_words,
    gpu_energy_badge,
    gpu_key,
    link_panels,
    links_text,
    power_now,
)
from gpunb.views.monitor_overview import overview_html
from gpunb.views.sparkline import COLORS, SparkPanel

# From this many GPUs the monitor shows one panel per metric with a line per GPU: two GPUs'
# blocks of five panels wrap to four rows at 1024 px with JupyterLab's file browser open.
OVERVIEW_FROM = 2
# Reasons worth a badge: a slowdown, or a cap the user might not know about. "idle" is not.
_BADGE_BITS = SLOWDOWN_BITS | 0x4 | 0x2 | 0x10
_WRAP = "display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _with(value: float | None, unit: str, digits: int = 0) -> str:
    """'42 %'-style text; 'n/a' alone (no dangling unit) when the reading is missing."""
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}" if unit.startswith(("%", "/")) else f"{value:,.{digits}f} {unit}"


def _latest(values: Sequence[float | None]) -> float | None:
    for v in reversed(values):
        if v is not None:
            return v
    return None


def _badge(panel: SparkPanel, index: int) -> str:
    """The throttle badge of GPU ``index``: the reasons active now, their share of the window in the tip."""
    events = [m for _, m in panel.events[index] if m is not None]
    pending = panel._pending.get(f"gpu{index}_clock_events", [])
    masks = events + [int(m) for m in pending]
    share = {}
    if masks:
        for bit, short, _ in CLOCK_EVENT_REASONS:
            if bit & _BADGE_BITS:
                hits = sum(1 for m in masks if m & bit)
                if hits:
                    share[short] = hits / len(masks)
    return clock_event_badge(panel.latest.get(f"gpu{index}_clock_events"), share)


def gpu_heading(panel: SparkPanel, g: GpuSeries, imbalance: Sequence[Any], several: bool = False) -> str:
    """The GPU's line above its panels: index, name, its energy since the start (with several
    GPUs), and a place that always holds the badges (so the block does not grow when one
    appears): the throttle badge, and the unbalanced-GPU badge when the monitor's finding names
    this GPU."""
    state = (' <span style="color:#e0413a;font-weight:bold">lost (no readings)</span>' if g.lost else "")
    badges = [b for b in (_badge(panel, g.index), imbalance_badge(imbalance, g.index)) if b]
    badge = " ".join(badges) or f'<span style="{SMALL};{DIM}">no throttling</span>'
    return (f'<div style="display:flex;flex-wrap:wrap;align-items:baseline;gap:2px 8px;min-height:18px;'
            f'margin:2px 0"><b style="font-size:13px">GPU {g.index}</b>'
            f'<span style="{DIM}" title="{_e(g.name)}">{_e(g.name)}</span>{gpu_energy_badge(g, several)}{state}'
            f'<span>{badge}</span></div>')


def gpu_html(panel: SparkPanel, g: GpuSeries, *, imbalance: Sequence[Any] = (), held: str = "",
             several: bool = False) -> str:
    """One GPU's block: its heading, then memory, utilization, power, temperature and SM clock
    panels (wrapping in a narrow window), then who holds its memory."""
    col = f"gpu{g.index}_"
    split = chart.legend([(COLORS["own"], "this kernel", False), (COLORS["other"], "other processes", False)])
    limit = chart.legend([(chart.RED, "limit", True)]) if g.power_limit_w else ""
    slowdown = panel.slowdown_c.get(g.index)
    slow = chart.legend([(chart.RED, "slowdown", True)]) if slowdown else ""
    panels = [
        panel.memory_panel(g, legend=split),
        panel.line(col + "util_pct", label=f"GPU {g.index} utilization", unit="%", color=COLORS["util"],
                   title="utilization (%)"),
        panel.line(col + "power_w", label=f"GPU {g.index} power", unit="W", color=COLORS["power"],
                   threshold=g.power_limit_w, threshold_words="power limit", title="power (W)", legend=limit),
        panel.line(col + "temp_c", label=f"GPU {g.index} temperature", unit="°C", color=COLORS["temp"],
                   threshold=slowdown, threshold_words="slowdown at", title="temperature (°C)", legend=slow),
        panel.line(col + "sm_clock_mhz", label=f"GPU {g.index} SM clock", unit="MHz", color=COLORS["clock"],
                   title="SM clock (MHz)"),
    ]
    return (f'<div class="gpunb-gpu" style="margin-bottom:6px">{gpu_heading(panel, g, imbalance, several)}'
            f'<div style="{_WRAP}">{"".join(panels)}</div>{held}</div>')


def host_html(panel: SparkPanel, gpus: Sequence[GpuSeries] = ()) -> str:
    """The host's block: CPU and RAM (RAM scaled to what is used, like GPU memory), then the
    GPUs' links to it and to each other (PCIe both ways, NVLink; views/links_view.py)."""
    total = panel.ram_total_mib
    cores = f"{panel.cpu_count} cores" if panel.cpu_count else "CPU"
    ram = f", {total / 1024:.1f} GiB RAM" if total else ""
    panels = [
        panel.line("cpu_pct", label="host CPU", unit="%", color=COLORS["cpu"], title="CPU (%), all cores"),
        panel.line("ram_used_mib", label="host RAM used", unit="GiB", color=COLORS["ram"], digits=1,
                   scale=1 / 1024, title=f"RAM used (GiB){f' of {total / 1024:.1f}' if total else ''}"),
    ]
    links = link_panels(panel, gpus)
    panels += links
    name = "Host and links" if links else "Host"
    key = f" {gpu_key(gpus)}" if links else ""  # the GPUs' colours in the link charts
    return (f'<div class="gpunb-host"><div style="margin:2px 0"><b style="font-size:13px">{name}</b> '
            f'<span style="{DIM}">{_e(cores + ram)}</span>{key}</div>'
            f'<div style="{_WRAP}">{"".join(panels)}</div></div>')


def panel_html(
    panel: SparkPanel,
    gpus: Sequence[GpuSeries],
    *,
    nvml: Any,
    gpu_count: int,
    notes: Sequence[str] = (),
    caption_text: str = "",
    clock_text: str = "",
    holders: Mapping[int, Sequence[str]] | None = None,
    imbalance: Sequence[Any] = (),
    tariff: Tariff | None = None,
    started_unix: float | None = None,
    per_gpu: str = "details",
) -> str:
    """The whole monitor: from two GPUs an overview (views/monitor_overview.py: a panel per
    metric with a line per GPU, a table, then each GPU's block: ``per_gpu`` "details" in a
    closed ``<details>``, "open" in an open one, "button" not drawn, a line names the button
    that shows them), else a block per GPU (``gpus`` gives names and lost flags now) with who
    holds its memory (``holders``: lines per GPU index) under it, the energy since the start
    (priced with ``tariff`` when the user named one), the host and the links, notes, a caption.
    ``imbalance`` (the unbalanced-GPU findings) is one line above the charts and a badge in
    each named GPU's heading."""
    holders = holders or {}
    panel.clock_text = clock_text
    shown = [g for g in gpus if g.index in panel.memory]
    parts = [imbalance_html(imbalance)] if imbalance else []
    if not gpus and not gpu_count:
        parts.append(no_gpu_html(nvml))
    overview = len(shown) >= OVERVIEW_FROM
    blocks = [] if overview and per_gpu == "button" else [
        gpu_html(panel, g, imbalance=imbalance, held=holders_html(holders.get(g.index, ())), several=len(shown) > 1)
        for g in shown]
    if overview:
        badges = {g.index: _badge(panel, g.index) for g in shown}
        parts.append(overview_html(panel, shown, badges=badges, per_gpu="".join(blocks), imbalance=imbalance,
                                   how=per_gpu))
    else:
        parts.extend(blocks)
    parts.append(energy_html(energy_words(shown, tariff, started_unix, power_now(shown, panel.latest))))
    parts.append(host_html(panel, shown))
    if notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in notes)
        parts.append(f'<ul class="gpunb-notes" style="margin:2px 0;padding-left:18px;font-size:11px">{items}</ul>')
    if caption_text:
        parts.append(f'<div class="gpunb-caption" style="font-size:11px;{DIM}">{_e(caption_text)}</div>')
    return (f'<div class="gpunb-monitor" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;'
            f'max-width:100%">{"".join(parts)}</div>')


def window_rows(window: Window) -> dict[str, list]:
    """A window's columns under the sampler's flat names (what ``SparkPanel.feed`` takes)."""
    rows: dict[str, list] = {"t_s": window.t_s, **window.host}
    for g in window.gpus:
        rows.update({f"gpu{g.index}_{name}": values for name, values in g.columns.items()})
    return rows


def clock_event_badge(mask: int | None, share: dict[str, float] | None = None) -> str:
    """A badge naming the active clock-event (throttle) reasons in words; '' when none."""
    if not mask:
        return ""
    active = [(short, words) for bit, short, words in CLOCK_EVENT_REASONS if mask & bit & _BADGE_BITS]
    if not active:
        return ""
    slowdown = bool(mask & SLOWDOWN_BITS)
    color = chart.RED if slowdown else chart.AMBER
    names = ", ".join(short for short, _ in active)
    tip = "; ".join(words for _, words in active)
    if share:
        tip += " — share of this window: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items())
    return (
        f'<span class="gpunb-badge" title="{_e(tip)}" style="display:inline-block;padding:0 5px;'
        f'border-radius:8px;border:1px solid {color};color:{color};font-size:10px;white-space:nowrap">'
        f"clocks held back: {_e(names)}</span>"
    )


def no_gpu_html(nvml: Any) -> str:
    """Why there is no GPU chart (``nvml`` is the NvmlStatus): the machine's one statement
    (gpunb.analysis.machine), its fix only where there is one to make."""
    said = read_state(nvml, None if not nvml.ok else 0)
    color = chart.GREY if said.severity == "info" else chart.AMBER
    fix = f'<br><span style="{DIM}">Fix: {_e(said.fix)}</span>' if said.fix else ""
    return (
        f'<div class="gpunb-nogpu" style="margin:4px 0;padding:4px 8px;border-left:3px solid {color}">'
        f"{_e(said.sentence)}{fix}</div>"
    )


def clock_time(started_unix: float | None, t_last: float | None) -> str:
    """Wall-clock time of the last sample (what the time axis ends at), '' when unknown."""
    if started_unix is None or t_last is None:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(started_unix + t_last))


def caption(state: str, *, hz: float, seconds: float, started_unix: float | None, t_last: float | None) -> str:
    """What the picture is, in words that stay true once the notebook is saved: when the
    last sample was taken (live) or when the monitor stopped."""
    when = ""
    if started_unix is not None and t_last is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_unix + t_last))
    shown = f"{chart.span_words(seconds)} window"
    if state == "stopped":
        head = f"gpunb monitor · stopped at {when}" if when else "gpunb monitor · stopped"
        return f"{head} · {hz:g} Hz · {shown}"
    if state == "paused":
        head = f"gpunb monitor · paused at {when}" if when else "gpunb monitor · paused"
        return f"{head} (sampling goes on; Resume shows the latest) · {hz:g} Hz · {shown}"
    if state == "live":  # no "live" in the words: a saved notebook keeps this frame, so it says so
        last = f"last sample {when}" if when else "waiting for the first sample"
        return (f"gpunb monitor · {last} · {hz:g} Hz · {shown} · redrawn while the monitor runs; "
                "a notebook saved now keeps this frame, and its buttons need the running kernel")
    return f"gpunb monitor · {state} · {hz:g} Hz · {shown}"


def panel_notes(window_notes: Sequence[str], messages: Sequence[str], fake: tuple[str, ...] = ()) -> list[str]:
    """That the figures are a recording (test stand-ins), first; the caller's messages (a clamped
    rate) and the sampler's last notes (faults)."""
    marked = [fake_note(fake)] if fake else []
    return marked + list(messages) + list(window_notes[-5:])


def monitor_html(window: Window, *, state: str = "live", messages: Sequence[str] = (),
                 holders: Mapping[int, Sequence[str]] | None = None, imbalance: Sequence[Any] = ()) -> str:
    """The whole monitor for one window, at once (snapshots, saved notebooks). ``state``
    is "live" or "stopped"; ``messages`` are the caller's own notes; ``imbalance`` the
    unbalanced-GPU findings."""
    panel = SparkPanel(
        window_s=window.seconds, hz=window.hz, gpus=window.gpus,
        ram_total_mib=window.ram_total_mib, cpu_count=window.cpu_count,
    )
    panel.feed(0, window_rows(window))
    t_last = window.t_s[-1] if window.t_s else None
    return panel_html(
        panel,
        window.gpus,
        nvml=window.nvml,
        gpu_count=window.gpu_count,
        notes=panel_notes(window.notes, messages, window.fake),
        caption_text=caption(state, hz=window.hz, seconds=window.seconds, started_unix=window.started_unix,
                             t_last=t_last),
        clock_text=clock_time(window.started_unix, t_last),
        holders=holders,
        imbalance=imbalance,
        tariff=window.tariff,
        started_unix=window.started_unix,
    )


def monitor_text(window: Window, holders: Mapping[int, Sequence[str]] | None = None) -> str:
    """One line per GPU (and who holds its memory) plus the host, for terminal IPython and
    ``text/plain``."""
    holders = holders or {}
    lines = [f"fake GPU readings ({', '.join(window.fake)}): a recording, not this machine"] if window.fake else []
    for g in window.gpus:
        c = g.columns
        util, used, own = _latest(c["util_pct"]), _latest(c["mem_used_mib"]), _latest(c["mem_own_mib"])
        power, temp, clock = _latest(c["power_w"]), _latest(c["temp_c"]), _latest(c["sm_clock_mhz"])
        events = int(_latest(c["clock_events"]) or 0)  # a bitmask (an unsigned column)
        mem = "n/a"
        if used is not None:
            total = f"/{g.memory_total_mib / 1024:.1f}" if g.memory_total_mib else " used of n/a"  # no made-up 0
            mem = f"{used / 1024:.1f}{total} GiB"
            if own is not None:
                mem += f" (this kernel {own / 1024:.1f})"
        limit = f"/{g.power_limit_w:.0f}" if g.power_limit_w else ""
        held = [short for bit, short, _ in CLOCK_EVENT_REASONS if events & bit & _BADGE_BITS]
        line = (
            f"GPU{g.index} {g.name}: util {_with(util, '%')} · mem {mem} · "
            f"power {_with(power, limit + ' W')} · {_with(temp, '°C')} · SM {_with(clock, 'MHz')}"
        )
        line += links_text(g)
        if held:
            line += f" · clocks held back: {', '.join(held)}"
        if g.lost:
            line += " · LOST"
        lines.append(line)
        lines.extend(holders_text(holders.get(g.index, ())))
    energy = energy_words(window.gpus, window.tariff, window.started_unix, power_now(window.gpus))
    if energy:
        lines.append(energy)
    if not window.gpus and not window.gpu_count:
        lines.append(without_gpu(window.nvml, None if not window.nvml.ok else 0))
    cpu, ram = _latest(window.host["cpu_pct"]), _latest(window.host["ram_used_mib"])
    total = f"/{window.ram_total_mib / 1024:.1f}" if window.ram_total_mib else ""
    lines.append(f"host: CPU {_with(cpu, '%')} · RAM {_with(None if ram is None else ram / 1024, total + ' GiB', 1)}")
    return "\n".join(lines)
