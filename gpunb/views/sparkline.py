"""Sampler windows drawn as inline SVG sparklines, HTML panels and one text line.

Pure functions: a :class:`~gpunb.analysis.sampler.Window` in, a string out. Every
dynamic string is escaped (GPU names and notes are not ours). The SVG is plain markup
(no script, no external CSS), so it renders in a core ``ipywidgets.HTML``, in a saved
notebook, in nbconvert's HTML and on GitHub.
"""

from __future__ import annotations

import html
import time
from typing import Callable, Sequence

from gpunb.analysis.sampler import GpuSeries, Window
from gpunb.readings.gpu import CLOCK_EVENT_REASONS, SLOWDOWN_BITS

WIDTH = 260
HEIGHT = 46
_PLOT_TOP = 14  # room for the label line
_COLORS = {
    "own": "#2f7ed8",
    "other": "#e4572e",
    "util": "#17a673",
    "power": "#d98c00",
    "temp": "#c2185b",
    "clock": "#6a51a3",
    "cpu": "#0f8b8d",
    "ram": "#7a6f5a",
}
# Reasons worth a badge: a slowdown, or a cap the user might not know about. "idle" is not.
_BADGE_BITS = SLOWDOWN_BITS | 0x4 | 0x2 | 0x10


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


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


def _bucket_max(t: Sequence[float], values: Sequence[float | None], t0: float, span: float, n: int):
    """At most ``n`` points: the largest value per time bucket (peaks are what matter in
    memory and load). A bucket with no reading stays a gap."""
    if len(t) <= n:
        return list(zip(t, values))
    buckets: dict[int, tuple[float, float | None]] = {}
    for ti, v in zip(t, values):
        b = min(n - 1, int((ti - t0) / span * n)) if span > 0 else 0
        prev = buckets.get(b)
        if prev is None or (v is not None and (prev[1] is None or v > prev[1])):
            buckets[b] = (ti, v)
    return [buckets[b] for b in sorted(buckets)]


def _segments(points, x_of: Callable[[float], float], y_of: Callable[[float], float]) -> list[list[str]]:
    """Polyline point lists, split where a reading is missing (a gap stays visible)."""
    runs: list[list[str]] = [[]]
    for ti, v in points:
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(f"{x_of(ti):.1f},{y_of(v):.1f}")
    return [r for r in runs if r]


def _frame(title: str, label: str, value_text: str, body: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gpunb-spark" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}" '
        f'style="font:11px sans-serif;overflow:visible">'
        f"<title>{_e(title)}</title>"
        f'<rect x="0.5" y="{_PLOT_TOP - 0.5}" width="{width - 1}" height="{height - _PLOT_TOP}" '
        f'fill="none" stroke="currentColor" stroke-opacity="0.15"/>'
        f'<text x="2" y="10" fill="currentColor" fill-opacity="0.75">{_e(label)}</text>'
        f'<text x="{width - 2}" y="10" text-anchor="end" fill="currentColor" font-weight="bold">{_e(value_text)}</text>'
        f"{body}</svg>"
    )


def _axes(t: Sequence[float], span: float, width: int, height: int, y_max: float):
    t1 = t[-1] if t else 0.0
    t0 = t1 - span
    x_of = lambda ti: (ti - t0) / span * (width - 2) + 1 if span > 0 else width - 1  # noqa: E731
    plot_h = height - _PLOT_TOP - 2
    y_of = lambda v: height - 1 - max(0.0, min(v, y_max)) / y_max * plot_h  # noqa: E731
    return t0, x_of, y_of


def sparkline_svg(
    t: Sequence[float],
    values: Sequence[float | None],
    *,
    label: str,
    unit: str,
    span_s: float,
    y_max: float | None = None,
    color: str = "#2f7ed8",
    digits: int = 0,
    width: int = WIDTH,
    height: int = HEIGHT,
    extra: str = "",
) -> str:
    """One series as a line over the last ``span_s`` seconds, latest value top right.

    ``y_max`` fixes the scale (100 for percentages, the power limit for watts); without
    it the scale is the window's largest value. The ``<title>`` is the hover tooltip.
    """
    known = [v for v in values if v is not None]
    top = y_max if y_max else (max(known) if known else 1.0) or 1.0
    latest = _latest(values)
    value_text = f"{_fmt(latest, digits)} {unit}".strip() if latest is not None else "n/a"
    t0, x_of, y_of = _axes(t, span_s, width, height, top)
    points = _bucket_max(t, values, t0, span_s, width)
    body = "".join(
        f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="1.5" '
        f'stroke-linejoin="round"/>'
        for run in _segments(points, x_of, y_of)
    )
    if known:
        stats = f"latest {value_text}; min {_fmt(min(known), digits)}, max {_fmt(max(known), digits)} {unit}"
    else:
        stats = "no reading in this window"
    gaps = sum(v is None for v in values)
    if gaps:
        stats += f"; {gaps} of {len(values)} readings missing"
    title = f"{label}{extra}: {stats} (last {span_s:g} s)"
    return _frame(title, label + extra, value_text, body, width, height)


def memory_svg(series: GpuSeries, t: Sequence[float], span_s: float, *, width: int = WIDTH, height: int = HEIGHT) -> str:
    """GPU memory as stacked areas: this kernel's share, other processes, free above."""
    cols = series.columns
    used, own, other = cols["mem_used_mib"], cols["mem_own_mib"], cols["mem_other_mib"]
    total = series.memory_total_mib or max([v for v in used if v is not None] or [1.0])
    _, x_of, y_of = _axes(t, span_s, width, height, total)

    def area(lows: Sequence[float | None], highs: Sequence[float | None], color: str) -> str:
        out = []
        run: list[tuple[float, float, float]] = []
        for ti, lo, hi in list(zip(t, lows, highs)) + [(None, None, None)]:
            if ti is None or lo is None or hi is None:
                if run:
                    top = " ".join(f"{x_of(a):.1f},{y_of(h):.1f}" for a, _, h in run)
                    bottom = " ".join(f"{x_of(a):.1f},{y_of(lo_):.1f}" for a, lo_, _ in reversed(run))
                    out.append(f'<polygon points="{top} {bottom}" fill="{color}" fill-opacity="0.55" stroke="{color}" stroke-width="0.8"/>')
                run = []
                continue
            run.append((ti, lo, hi))
        return "".join(out)

    zero = [0.0 if v is not None else None for v in used]
    if any(v is not None for v in own):
        body = area(zero, own, _COLORS["own"]) + area(own, used, _COLORS["other"])
        split = "own / other"
    else:  # no per-process memory (MIG, no permission): one block, not a wrong split
        body = area(zero, used, _COLORS["other"])
        split = "all processes"
    u, o, ot = _latest(used), _latest(own), _latest(other)
    value_text = "n/a" if u is None else f"{u / 1024:.1f} / {total / 1024:.1f} GiB"
    if u is None:
        stats = "no reading in this window"
    elif o is None:
        stats = f"used {u / 1024:.2f} GiB (per-process split unknown), free {(total - u) / 1024:.2f} GiB"
    else:
        stats = (
            f"this kernel {o / 1024:.2f} GiB, other processes {(ot or 0) / 1024:.2f} GiB, "
            f"free {(total - u) / 1024:.2f} GiB of {total / 1024:.1f} GiB"
        )
    title = f"GPU {series.index} memory: {stats} (last {span_s:g} s)"
    return _frame(title, f"memory ({split})", value_text, body, width, height)


def clock_event_badge(mask: int | None, share: dict[str, float] | None = None) -> str:
    """A badge naming the active clock-event (throttle) reasons in words; '' when none."""
    if not mask:
        return ""
    active = [(short, words) for bit, short, words in CLOCK_EVENT_REASONS if mask & bit & _BADGE_BITS]
    if not active:
        return ""
    slowdown = bool(mask & SLOWDOWN_BITS)
    color = "#b3261e" if slowdown else "#8a6100"
    names = ", ".join(short for short, _ in active)
    tip = "; ".join(words for _, words in active)
    if share:
        tip += " — share of this window: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items())
    return (
        f'<span class="gpunb-badge" title="{_e(tip)}" style="display:inline-block;padding:0 6px;'
        f'margin-left:6px;border-radius:8px;border:1px solid {color};color:{color};font-size:11px">'
        f"clocks held back: {_e(names)}</span>"
    )


def _event_share(events: Sequence[int | None]) -> dict[str, float]:
    known = [e for e in events if e is not None]
    if not known:
        return {}
    out = {}
    for bit, short, _ in CLOCK_EVENT_REASONS:
        if bit & _BADGE_BITS:
            n = sum(1 for e in known if e & bit)
            if n:
                out[short] = n / len(known)
    return out


def gpu_panel_html(series: GpuSeries, t: Sequence[float], span_s: float) -> str:
    c = series.columns
    limit = series.power_limit_w
    header = f"GPU {series.index} · {_e(series.name)}"
    if series.lost:
        header += ' <span style="color:#b3261e">· lost (no readings)</span>'
    badge = clock_event_badge(_latest(c["clock_events"]), _event_share(c["clock_events"]))
    charts = [
        memory_svg(series, t, span_s),
        sparkline_svg(t, c["util_pct"], label="utilization", unit="%", span_s=span_s, y_max=100, color=_COLORS["util"]),
        sparkline_svg(
            t, c["power_w"], label="power", unit="W", span_s=span_s, y_max=limit, color=_COLORS["power"],
            extra=f" (limit {limit:.0f} W)" if limit else "",
        ),
        sparkline_svg(t, c["temp_c"], label="temperature", unit="°C", span_s=span_s, y_max=100, color=_COLORS["temp"]),
        sparkline_svg(t, c["sm_clock_mhz"], label="SM clock", unit="MHz", span_s=span_s, color=_COLORS["clock"]),
    ]
    return (
        f'<div class="gpunb-gpu" style="margin:4px 0">'
        f'<div style="font-weight:bold;margin-bottom:2px">{header}{badge}</div>'
        f'<div style="display:flex;flex-wrap:wrap;gap:6px">{"".join(charts)}</div></div>'
    )


def host_panel_html(window: Window) -> str:
    t, span = window.t_s, window.seconds
    ram_total = window.ram_total_mib
    cpu_label = f"host CPU ({window.cpu_count} cores)" if window.cpu_count else "host CPU"
    ram = [None if v is None else v / 1024 for v in window.host["ram_used_mib"]]
    charts = [
        sparkline_svg(t, window.host["cpu_pct"], label=cpu_label, unit="%", span_s=span, y_max=100, color=_COLORS["cpu"]),
        sparkline_svg(
            t, ram, label="host RAM used", unit="GiB", span_s=span, digits=1,
            y_max=(ram_total / 1024) if ram_total else None, color=_COLORS["ram"],
            extra=f" (of {ram_total / 1024:.1f} GiB)" if ram_total else "",
        ),
    ]
    return (
        '<div class="gpunb-host" style="margin:4px 0"><div style="font-weight:bold;margin-bottom:2px">Host</div>'
        f'<div style="display:flex;flex-wrap:wrap;gap:6px">{"".join(charts)}</div></div>'
    )


def no_gpu_html(window: Window) -> str:
    if window.nvml.ok:
        cause = "NVML sees no GPU on this machine."
        fix = "Check `nvidia-smi`; in a container, start it with GPU access (`--gpus all`)."
    else:
        cause, fix = window.nvml.cause, window.nvml.fix
    return (
        '<div class="gpunb-nogpu" style="margin:4px 0;padding:4px 8px;border-left:3px solid #8a6100">'
        f"<b>No GPU to show</b> — only the host is monitored. {_e(cause)}"
        f'<br><span style="opacity:0.8">Fix: {_e(fix)}</span></div>'
    )


def monitor_html(window: Window, *, state: str = "live", messages: Sequence[str] = ()) -> str:
    """The whole monitor: one panel per GPU, the host, notes. ``state`` is shown in the
    caption: "live", "paused", or "stopped" (a static snapshot). ``messages`` are the
    caller's own notes (e.g. a clamped rate)."""
    parts = [gpu_panel_html(g, window.t_s, window.seconds) for g in window.gpus]
    if not window.gpus and not window.gpu_count:
        parts.append(no_gpu_html(window))
    parts.append(host_panel_html(window))
    notes = [m for m in messages if not m.startswith("No GPU to show")] + list(window.notes[-5:])
    if notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in notes)
        parts.append(f'<ul class="gpunb-notes" style="margin:2px 0;padding-left:18px;font-size:11px">{items}</ul>')
    parts.append(f'<div style="font-size:11px;opacity:0.7">{_e(caption(window, state))}</div>')
    return f'<div class="gpunb-monitor" style="font-family:sans-serif;font-size:12px">{"".join(parts)}</div>'


def caption(window: Window, state: str) -> str:
    when = ""
    if window.started_unix is not None and window.t_s:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(window.started_unix + window.t_s[-1]))
    words = {
        "live": f"gpunb monitor · live at {window.hz:g} Hz · last {window.seconds:g} s",
        "paused": f"gpunb monitor · paused (sampling continues at {window.hz:g} Hz) · last {window.seconds:g} s",
        "stopped": f"gpunb monitor · stopped · snapshot of the last {window.seconds:g} s",
    }.get(state, state)
    return f"{words}" + (f" · {when}" if when else "")


def monitor_text(window: Window) -> str:
    """One line per GPU plus the host, for terminal IPython and ``text/plain``."""
    lines = []
    for g in window.gpus:
        c = g.columns
        util, used, own = _latest(c["util_pct"]), _latest(c["mem_used_mib"]), _latest(c["mem_own_mib"])
        power, temp, clock = _latest(c["power_w"]), _latest(c["temp_c"]), _latest(c["sm_clock_mhz"])
        events = _latest(c["clock_events"]) or 0
        mem = "n/a"
        if used is not None:
            mem = f"{used / 1024:.1f}/{(g.memory_total_mib or 0) / 1024:.1f} GiB"
            if own is not None:
                mem += f" (this kernel {own / 1024:.1f})"
        limit = f"/{g.power_limit_w:.0f}" if g.power_limit_w else ""
        held = [short for bit, short, _ in CLOCK_EVENT_REASONS if events & bit & _BADGE_BITS]
        line = (
            f"GPU{g.index} {g.name}: util {_with(util, '%')} · mem {mem} · "
            f"power {_with(power, limit + ' W')} · {_with(temp, '°C')} · SM {_with(clock, 'MHz')}"
        )
        if held:
            line += f" · clocks held back: {', '.join(held)}"
        if g.lost:
            line += " · LOST"
        lines.append(line)
    if not window.gpus and not window.gpu_count:
        cause = window.nvml.cause if not window.nvml.ok else "NVML sees no GPU."
        lines.append(f"No GPU to show ({cause}); monitoring the host only.")
    cpu, ram = _latest(window.host["cpu_pct"]), _latest(window.host["ram_used_mib"])
    total = f"/{window.ram_total_mib / 1024:.1f}" if window.ram_total_mib else ""
    lines.append(f"host: CPU {_with(cpu, '%')} · RAM {_with(None if ram is None else ram / 1024, total + ' GiB', 1)}")
    return "\n".join(lines)
