"""Sampler windows drawn as inline SVG sparklines, HTML panels and one text line.

Pure functions: a :class:`~gpunb.analysis.sampler.Window` in, a string out. Every
dynamic string is escaped (GPU names and notes are not ours). The SVG is plain markup
(no script, no external CSS), so it renders in a core ``ipywidgets.HTML``, in a saved
notebook, in nbconvert's HTML and on GitHub.
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpunb.analysis.sampler import GpuSeries, Window
from gpunb.readings.gpu import CLOCK_EVENT_REASONS, SLOWDOWN_BITS
from gpunb.views.holders_view import holders_html, holders_text

WIDTH = 260
# Points per chart: about one per two pixels. Rows beyond that are merged into buckets.
MAX_POINTS = 130
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


def _frame(title: str, label: str, value_text: str, body: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gpunb-spark" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}" '
        f'style="font:11px sans-serif;overflow:hidden">'
        f"<title>{_e(title)}</title>"
        f'<rect x="0.5" y="{_PLOT_TOP - 0.5}" width="{width - 1}" height="{height - _PLOT_TOP}" '
        f'fill="none" stroke="currentColor" stroke-opacity="0.15"/>'
        f'<text x="2" y="10" fill="currentColor" fill-opacity="0.75">{_e(label)}</text>'
        f'<text x="{width - 2}" y="10" text-anchor="end" fill="currentColor" font-weight="bold">{_e(value_text)}</text>'
        f"{body}</svg>"
    )


def _path_d(texts: Iterable[str], tail: str = "") -> str:
    """Join path pieces ("M x,y" starts a run, "L x,y" continues it); a path must start
    with M even when its first pieces scrolled out of the window."""
    d = " ".join(filter(None, texts))
    if tail:
        d = f"{d} {tail}" if d else tail
    return "M" + d[1:] if d.startswith("L") else d


class _Track:
    """One chart's points, one per bucket of rows, already formatted: a redraw only
    formats the newest bucket and joins strings (the sampler thread holds the GIL while
    drawing, so the cost must not grow with the window)."""

    def __init__(self, panel: SparkPanel, key: str, y_max: float | None) -> None:
        self.panel = panel
        self.key = key
        self.fixed = bool(y_max)
        self.top = float(y_max) if y_max else 1.0
        self.items: deque[list] = deque()  # [t, vmax, vmin, text]; text "" marks a gap
        self.prev_gap = True
        self.latest: float | None = None

    def _text(self, t: float, v: float, new_run: bool) -> str:
        p = self.panel
        v = self.top if v > self.top else (v if v > 0 else 0.0)
        return f"{'M' if new_run else 'L'}{t * p.xs:.1f},{p.base - v * p.ys / self.top:.1f}"

    def add(self, t: float, values: list, new_run: bool) -> None:
        if not values:
            self.items.append([t, None, None, ""])
            self.prev_gap = True
            return
        vmax, vmin = max(values), min(values)
        if not self.fixed and vmax > self.top:
            self.top = vmax * 1.25  # room above; every point is re-placed once
            self._rebuild()
        self.items.append([t, vmax, vmin, self._text(t, vmax, new_run or self.prev_gap)])
        self.prev_gap = False

    def _rebuild(self) -> None:
        gap = True
        for item in self.items:
            if item[1] is None:
                gap = True
                continue
            item[3] = self._text(item[0], item[1], gap or item[3].startswith("M"))
            gap = False

    def pending_text(self, t: float | None, values: list, new_run: bool) -> str:
        if t is None or not values:
            return ""
        return self._text(t, max(values), new_run or self.prev_gap)

    def stats(self, values: list) -> tuple[float | None, float | None, int, int]:
        lows = [it[2] for it in self.items if it[2] is not None] + values
        highs = [it[1] for it in self.items if it[1] is not None] + values
        gaps = sum(1 for it in self.items if it[1] is None)
        return (min(lows) if lows else None, max(highs) if highs else None, gaps, len(self.items) + bool(values))


class SparkPanel:
    """The monitor panel, drawn incrementally: ``feed()`` rows as the sampler adds them,
    ``html()`` whenever a frame is wanted. Rows are merged ``k`` at a time (largest
    value per bucket, buckets aligned to the row number) so a chart has at most
    ``max_points`` points whatever the rate. The static snapshot uses the same class,
    fed the whole window at once, so live and saved pictures look the same."""

    def __init__(
        self,
        *,
        window_s: float,
        hz: float,
        gpus: Sequence[GpuSeries],
        ram_total_mib: float | None,
        cpu_count: int | None,
        max_points: int = MAX_POINTS,
        width: int = WIDTH,
        height: int = HEIGHT,
    ) -> None:
        self.window_s, self.hz, self.width, self.height = window_s, hz, width, height
        self.k = max(1, math.ceil(window_s * hz / max_points))
        self.xs = (width - 2) / window_s
        self.base = height - 1.0
        self.ys = height - _PLOT_TOP - 2.0
        self.bar_w = max(1.0, self.k / hz * self.xs + 0.4)  # memory bars touch each other
        self.break_s = max(3.0 / hz, 1.5 * self.k / hz)  # a longer pause breaks the line
        self.cpu_count = cpu_count
        self.ram_total_mib = ram_total_mib
        self.next_index = 0
        self.t_last: float | None = None
        self._bucket: int | None = None
        self._pending: dict[str, list] = {}
        self._pending_t: float | None = None
        self._prev_t: float | None = None
        self.tracks: dict[str, _Track] = {}
        self.memory: dict[int, tuple[_Track, _Track]] = {}
        self.events: dict[int, deque] = {}
        self.latest: dict[str, Any] = {}
        for g in gpus:
            col = f"gpu{g.index}_"
            self.tracks[col + "util_pct"] = _Track(self, col + "util_pct", 100)
            self.tracks[col + "power_w"] = _Track(self, col + "power_w", g.power_limit_w)
            self.tracks[col + "temp_c"] = _Track(self, col + "temp_c", 100)
            self.tracks[col + "sm_clock_mhz"] = _Track(self, col + "sm_clock_mhz", g.max_sm_clock_mhz)
            total = g.memory_total_mib
            self.memory[g.index] = (_Track(self, col + "mem_used_mib", total), _Track(self, col + "mem_own_mib", total))
            self.events[g.index] = deque()  # [t, mask]
        self.tracks["cpu_pct"] = _Track(self, "cpu_pct", 100)
        self.tracks["ram_used_mib"] = _Track(self, "ram_used_mib", ram_total_mib)
        self._keys = list(self.tracks) + [t.key for pair in self.memory.values() for t in pair] + [
            f"gpu{i}_clock_events" for i in self.events
        ]

    # -- feeding ------------------------------------------------------------------
    def feed(self, first_index: int, rows: dict[str, list]) -> None:
        """Add rows numbered from ``first_index`` (rows already fed are skipped)."""
        t_col = rows.get("t_s", [])
        keys = [k for k in self._keys if k in rows]
        for i, t in enumerate(t_col):
            n = first_index + i
            if n < self.next_index:
                continue
            bucket = n // self.k
            if bucket != self._bucket:
                self._finish_bucket()
                self._bucket = bucket
                self._pending = {k: [] for k in keys}
            for k in keys:
                v = rows[k][i]
                self.latest[k] = v
                if v is not None:
                    self._pending[k].append(v)
            self._pending_t = t
            self.next_index = n + 1
            self.t_last = t
        self._trim()

    def _new_run(self) -> bool:
        prev, pending = self._prev_t, self._pending_t
        return prev is not None and pending is not None and pending - prev > self.break_s

    def _finish_bucket(self) -> None:
        t = self._pending_t
        if self._bucket is None or t is None:
            return
        new_run = self._new_run()
        for key, track in self.tracks.items():
            track.add(t, self._pending.get(key, []), new_run)
        for used, own in self.memory.values():
            used.add(t, self._pending.get(used.key, []), new_run)
            own.add(t, self._pending.get(own.key, []), new_run)
        for index, events in self.events.items():
            masks = self._pending.get(f"gpu{index}_clock_events", [])
            bits = 0
            for m in masks:
                bits |= int(m)
            events.append([t, bits if masks else None])
        self._prev_t = t
        self._pending = {}
        self._pending_t = None

    def _trim(self) -> None:
        if self.t_last is None:
            return
        oldest = self.t_last - self.window_s
        tracks = list(self.tracks.values()) + [t for pair in self.memory.values() for t in pair]
        for track in tracks:
            while track.items and track.items[0][0] < oldest:
                track.items.popleft()
        for events in self.events.values():
            while events and events[0][0] < oldest:
                events.popleft()

    # -- drawing ------------------------------------------------------------------
    def _shift(self) -> str:
        t_last = self.t_last or 0.0
        return "%.1f" % (1 - (t_last - self.window_s) * self.xs)

    def _line(self, key: str, *, label: str, unit: str, color: str, digits: int = 0, scale: float = 1.0,
              extra: str = "") -> str:
        track = self.tracks[key]
        pending = self._pending.get(key, [])
        d = _path_d((it[3] for it in track.items), track.pending_text(self._pending_t, pending, self._new_run()))
        latest = self.latest.get(key)
        value_text = "n/a" if latest is None else f"{latest * scale:,.{digits}f} {unit}".strip()
        lo, hi, gaps, n = track.stats(pending)
        if hi is None or lo is None:  # (both or neither)
            stats = "no reading in this window"
        else:
            stats = f"latest {value_text}; min {lo * scale:,.{digits}f}, max {hi * scale:,.{digits}f} {unit}"
        if gaps:
            stats += f"; {gaps} of {n} points have no reading"
        title = f"{label}{extra}: {stats} (last {self.window_s:g} s)"
        body = (
            f'<g transform="translate({self._shift()},0)"><path d="{d}" fill="none" stroke="{color}" '
            f'stroke-width="1.5" stroke-linejoin="round"/></g>'
            if d else ""
        )
        return _frame(title, label + extra, value_text, body, self.width, self.height)

    def _memory(self, g: GpuSeries) -> str:
        used, own = self.memory[g.index]
        total = used.top
        p_used, p_own = self._pending.get(used.key, []), self._pending.get(own.key, [])
        split = any(it[1] is not None for it in own.items) or bool(p_own)
        bars_own, bars_other = [], []
        points = [(it[0], it[1], o[1]) for it, o in zip(used.items, own.items)]
        if self._pending_t is not None and p_used:
            points.append((self._pending_t, max(p_used), max(p_own) if p_own else None))
        for t, u, o in points:
            if u is None:
                continue
            x = t * self.xs
            y_used = self.base - min(u, total) / total * self.ys
            if split and o is not None:
                y_own = self.base - min(o, u) / total * self.ys
                bars_own.append(f"M{x:.1f},{self.base:.1f}V{y_own:.1f}")
                bars_other.append(f"M{x:.1f},{y_own:.1f}V{y_used:.1f}")
            else:
                bars_other.append(f"M{x:.1f},{self.base:.1f}V{y_used:.1f}")
        body = "".join(
            f'<path d="{" ".join(bars)}" stroke="{color}" stroke-opacity="0.7" stroke-width="{self.bar_w:.1f}"/>'
            for bars, color in ((bars_own, _COLORS["own"]), (bars_other, _COLORS["other"]))
            if bars
        )
        if body:
            body = f'<g transform="translate({self._shift()},0)">{body}</g>'
        u, o = self.latest.get(used.key), self.latest.get(own.key)
        value_text = "n/a" if u is None else f"{u / 1024:.1f} / {total / 1024:.1f} GiB"
        if u is None:
            stats = "no reading now"
        elif o is None:
            stats = f"used {u / 1024:.2f} GiB (per-process split unknown), free {(total - u) / 1024:.2f} GiB"
        else:
            stats = (
                f"this kernel {o / 1024:.2f} GiB, other processes {max(0.0, u - o) / 1024:.2f} GiB, "
                f"free {(total - u) / 1024:.2f} GiB of {total / 1024:.1f} GiB"
            )
        _, hi, _, _ = used.stats(p_used)
        if hi is not None:
            stats += f"; peak in window {hi / 1024:.2f} GiB"
        title = f"GPU {g.index} memory: {stats} (last {self.window_s:g} s)"
        label = "memory (this kernel / other)" if split else "memory (all processes)"
        return _frame(title, label, value_text, body, self.width, self.height)

    def _badge(self, index: int) -> str:
        events = [m for _, m in self.events[index] if m is not None]
        pending = self._pending.get(f"gpu{index}_clock_events", [])
        masks = events + [int(m) for m in pending]
        share = {}
        if masks:
            for bit, short, _ in CLOCK_EVENT_REASONS:
                if bit & _BADGE_BITS:
                    hits = sum(1 for m in masks if m & bit)
                    if hits:
                        share[short] = hits / len(masks)
        return clock_event_badge(self.latest.get(f"gpu{index}_clock_events"), share)

    def gpu_html(self, g: GpuSeries) -> str:
        col = f"gpu{g.index}_"
        limit = g.power_limit_w
        header = f"GPU {g.index} · {_e(g.name)}"
        if g.lost:
            header += ' <span style="color:#b3261e">· lost (no readings)</span>'
        charts = [
            self._memory(g),
            self._line(col + "util_pct", label="utilization", unit="%", color=_COLORS["util"]),
            self._line(col + "power_w", label="power", unit="W", color=_COLORS["power"],
                       extra=f" (limit {limit:.0f} W)" if limit else ""),
            self._line(col + "temp_c", label="temperature", unit="°C", color=_COLORS["temp"]),
            self._line(col + "sm_clock_mhz", label="SM clock", unit="MHz", color=_COLORS["clock"]),
        ]
        return (
            f'<div class="gpunb-gpu" style="margin:4px 0">'
            f'<div style="font-weight:bold;margin-bottom:2px">{header}{self._badge(g.index)}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:6px">{"".join(charts)}</div></div>'
        )

    def host_html(self) -> str:
        total = self.ram_total_mib
        cpu_label = f"host CPU ({self.cpu_count} cores)" if self.cpu_count else "host CPU"
        charts = [
            self._line("cpu_pct", label=cpu_label, unit="%", color=_COLORS["cpu"]),
            self._line("ram_used_mib", label="host RAM used", unit="GiB", color=_COLORS["ram"], digits=1,
                       scale=1 / 1024, extra=f" (of {total / 1024:.1f} GiB)" if total else ""),
        ]
        return (
            '<div class="gpunb-host" style="margin:4px 0"><div style="font-weight:bold;margin-bottom:2px">Host</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:6px">{"".join(charts)}</div></div>'
        )

    def html(
        self,
        gpus: Sequence[GpuSeries],
        *,
        nvml: Any,
        gpu_count: int,
        notes: Sequence[str] = (),
        caption_text: str = "",
        holders: Mapping[int, Sequence[str]] | None = None,
    ) -> str:
        """The whole monitor: a panel per GPU (``gpus`` gives names and lost flags now)
        with who holds its memory (``holders``: lines per GPU index), the host, notes, a
        caption."""
        holders = holders or {}
        parts = [self.gpu_html(g) + holders_html(holders.get(g.index, ())) for g in gpus if g.index in self.memory]
        if not gpus and not gpu_count:
            parts.append(no_gpu_html(nvml))
        parts.append(self.host_html())
        if notes:
            items = "".join(f"<li>{_e(n)}</li>" for n in notes)
            parts.append(f'<ul class="gpunb-notes" style="margin:2px 0;padding-left:18px;font-size:11px">{items}</ul>')
        if caption_text:
            parts.append(f'<div style="font-size:11px;opacity:0.7">{_e(caption_text)}</div>')
        return f'<div class="gpunb-monitor" style="font-family:sans-serif;font-size:12px">{"".join(parts)}</div>'


def window_rows(window: Window) -> dict[str, list]:
    """A window's columns under the sampler's flat names (what ``SparkPanel.feed`` takes)."""
    rows: dict[str, list] = {"t_s": window.t_s, **window.host}
    for g in window.gpus:
        rows.update({f"gpu{g.index}_{name}": values for name, values in g.columns.items()})
    return rows


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
    hz: float | None = None,
    extra: str = "",
) -> str:
    """One series as a line over the last ``span_s`` seconds, latest value top right.
    ``y_max`` fixes the scale (100 for percentages, the power limit for watts); without
    it the scale grows with the data. The ``<title>`` is the hover tooltip."""
    if hz is None:
        hz = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else 1.0
    panel = SparkPanel(window_s=span_s, hz=hz, gpus=(), ram_total_mib=None, cpu_count=None)
    panel.tracks["x"] = _Track(panel, "x", y_max)
    panel._keys.append("x")
    panel.feed(0, {"t_s": list(t), "x": list(values)})
    return panel._line("x", label=label, unit=unit, color=color, digits=digits, extra=extra)


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


def no_gpu_html(nvml: Any) -> str:
    """Why there is no GPU chart (``nvml`` is the NvmlStatus), and what to do."""
    if nvml.ok:
        cause = "NVML sees no GPU on this machine."
        fix = "Check `nvidia-smi`; in a container, start it with GPU access (`--gpus all`)."
    else:
        cause, fix = nvml.cause, nvml.fix
    return (
        '<div class="gpunb-nogpu" style="margin:4px 0;padding:4px 8px;border-left:3px solid #8a6100">'
        f"<b>No GPU to show</b> — only the host is monitored. {_e(cause)}"
        f'<br><span style="opacity:0.8">Fix: {_e(fix)}</span></div>'
    )


def caption(state: str, *, hz: float, seconds: float, started_unix: float | None, t_last: float | None) -> str:
    words = {
        "live": f"gpunb monitor · live at {hz:g} Hz · last {seconds:g} s",
        "paused": f"gpunb monitor · paused (sampling goes on at {hz:g} Hz) · last {seconds:g} s",
        "stopped": f"gpunb monitor · stopped · snapshot of the last {seconds:g} s",
    }.get(state, state)
    if started_unix is not None and t_last is not None:
        words += " · " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_unix + t_last))
    return words


def panel_notes(window_notes: Sequence[str], messages: Sequence[str]) -> list[str]:
    """The caller's messages (a clamped rate) and the sampler's last notes (faults)."""
    return [m for m in messages if not m.startswith("No GPU to show")] + list(window_notes[-5:])


def monitor_html(window: Window, *, state: str = "live", messages: Sequence[str] = (),
                 holders: Mapping[int, Sequence[str]] | None = None) -> str:
    """The whole monitor for one window, at once (snapshots, saved notebooks). ``state``
    is "live", "paused" or "stopped"; ``messages`` are the caller's own notes."""
    panel = SparkPanel(
        window_s=window.seconds, hz=window.hz, gpus=window.gpus,
        ram_total_mib=window.ram_total_mib, cpu_count=window.cpu_count,
    )
    panel.feed(0, window_rows(window))
    return panel.html(
        window.gpus,
        nvml=window.nvml,
        gpu_count=window.gpu_count,
        notes=panel_notes(window.notes, messages),
        caption_text=caption(state, hz=window.hz, seconds=window.seconds, started_unix=window.started_unix,
                             t_last=window.t_s[-1] if window.t_s else None),
        holders=holders,
    )


def monitor_text(window: Window, holders: Mapping[int, Sequence[str]] | None = None) -> str:
    """One line per GPU (and who holds its memory) plus the host, for terminal IPython and
    ``text/plain``."""
    holders = holders or {}
    lines = []
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
        if held:
            line += f" · clocks held back: {', '.join(held)}"
        if g.lost:
            line += " · LOST"
        lines.append(line)
        lines.extend(holders_text(holders.get(g.index, ())))
    if not window.gpus and not window.gpu_count:
        cause = window.nvml.cause if not window.nvml.ok else "NVML sees no GPU."
        lines.append(f"No GPU to show ({cause}); monitoring the host only.")
    cpu, ram = _latest(window.host["cpu_pct"]), _latest(window.host["ram_used_mib"])
    total = f"/{window.ram_total_mib / 1024:.1f}" if window.ram_total_mib else ""
    lines.append(f"host: CPU {_with(cpu, '%')} · RAM {_with(None if ram is None else ram / 1024, total + ' GiB', 1)}")
    return "\n".join(lines)
