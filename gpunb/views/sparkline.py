"""The monitor drawn: one row per GPU of small charts with scales, a host row, one text line.

Pure functions and a drawing class: sampler rows in, a string out. The HTML is a table
with fixed column widths (one row per GPU, one column per reading), so eight GPUs stay
readable and nothing wraps freely. Each chart is an SVG shown as a data-URI ``<img>``
(:mod:`gpunb.views.chart`: it survives untrusted notebooks, saving and nbconvert); its
scale, latest value, window maximum, legend and time axis are HTML words around it, in
the theme's own colours. Every dynamic string is escaped (GPU names and notes are not ours).
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpunb.analysis.monitor.series import GpuSeries, Window
from gpunb.readings.gpu import CLOCK_EVENT_REASONS, SLOWDOWN_BITS
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL
from gpunb.views.holders_view import holders_html, holders_text
from gpunb.views.imbalance_view import imbalance_badge, imbalance_html

WIDTH = 100  # plot pixels of one chart
HEIGHT = 38
# Points per chart: about one per pixel. Rows beyond that are merged into buckets.
MAX_POINTS = 100
_TOP = 2.0  # the scale's top is drawn this far below the image's edge (a line there stays whole)
_LABEL_W = 104  # the GPU column
_SCALE_W = 26  # the scale's numbers beside a chart
_CELL_W = WIDTH + _SCALE_W + 12  # chart, its scale, padding
MEMORY_FLOOR_MIB = 1024.0  # a memory scale never shows less than 1 GiB
_COLORS = {
    "own": chart.BLUE,
    "other": chart.ORANGE,
    "util": chart.GREEN,
    "power": chart.AMBER,
    "temp": chart.PINK,
    "clock": chart.PURPLE,
    "cpu": chart.TEAL,
    "ram": chart.GREY,
}
# Reasons worth a badge: a slowdown, or a cap the user might not know about. "idle" is not.
_BADGE_BITS = SLOWDOWN_BITS | 0x4 | 0x2 | 0x10


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


def _path_d(texts: Iterable[str], tail: str = "") -> str:
    """Join path pieces ("M x,y" starts a run, "L x,y" continues it); a path must start
    with M even when its first pieces scrolled out of the window."""
    d = " ".join(filter(None, texts))
    if tail:
        d = f"{d} {tail}" if d else tail
    return "M" + d[1:] if d.startswith("L") else d


def memory_scale(peak: float | None, capacity: float | None, floor: float = MEMORY_FLOOR_MIB) -> float:
    """The top of a memory chart in MiB: what is used (with room above) on a round number
    of GiB, not the capacity, so a few GiB on a 140 GiB GPU are not a flat line; the
    capacity itself once use comes near it."""
    top = chart.nice_ceiling(max((peak or 0.0) * 1.15, floor) / 1024) * 1024
    if capacity and top >= 0.8 * capacity:
        return float(capacity)
    return top


class _Track:
    """One chart's points, one per bucket of rows, already formatted: a redraw only
    formats the newest bucket and joins strings (the sampler thread holds the GIL while
    drawing, so the cost must not grow with the window). ``scale`` (for memory) picks the
    top from the window's peak; without it the top is fixed."""

    def __init__(self, panel: SparkPanel, key: str, top: float | None,
                 scale: Callable[[float | None], float] | None = None) -> None:
        self.panel = panel
        self.key = key
        self.scale = scale
        self.fixed = bool(top)
        self.top = float(top) if top else (scale(None) if scale else 1.0)
        self.items: deque[list] = deque()  # [t, vmax, vmin, text]; text "" marks a gap
        self.prev_gap = True

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
        if vmax > self.top:
            if self.scale is not None:
                self.set_top(self.scale(vmax))
            elif not self.fixed:  # no known limit: grow with the data (every point re-placed once)
                self.set_top(vmax * 1.25)
        self.items.append([t, vmax, vmin, self._text(t, vmax, new_run or self.prev_gap)])
        self.prev_gap = False

    def set_top(self, top: float) -> None:
        if top == self.top or not top > 0:
            return
        self.top = top
        gap = True
        for item in self.items:
            if item[1] is None:
                gap = True
                continue
            item[3] = self._text(item[0], item[1], gap or item[3].startswith("M"))
            gap = False

    def fit_scale(self, pending: list) -> None:
        """Rescale to the window's peak (it may have scrolled out since the last frame)."""
        if self.scale is not None:
            self.set_top(self.scale(self.stats(pending)[1]))

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
        self.xs = (width - 1) / window_s
        self.base = height - 1.0
        self.ys = height - 1.0 - _TOP
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
        self.slowdown_c: dict[int, float | None] = {}
        self.imbalance: Sequence[Any] = ()  # the unbalanced-GPU findings of the frame being drawn
        for g in gpus:
            col = f"gpu{g.index}_"
            self.tracks[col + "util_pct"] = _Track(self, col + "util_pct", 100)
            # Power and temperature leave room above their limit, so the limit line shows.
            power_top = chart.nice_ceiling(g.power_limit_w * 1.08) if g.power_limit_w else None
            self.tracks[col + "power_w"] = _Track(self, col + "power_w", power_top)
            self.slowdown_c[g.index] = g.temp_slowdown_c
            temp_top = max(100.0, chart.nice_ceiling(g.temp_slowdown_c + 5)) if g.temp_slowdown_c else 100
            self.tracks[col + "temp_c"] = _Track(self, col + "temp_c", temp_top)
            self.tracks[col + "sm_clock_mhz"] = _Track(self, col + "sm_clock_mhz", g.max_sm_clock_mhz)
            total = g.memory_total_mib
            scale = lambda peak, total=total: memory_scale(peak, total)  # noqa: E731
            self.memory[g.index] = (_Track(self, col + "mem_used_mib", None, scale),
                                    _Track(self, col + "mem_own_mib", None, scale))
            self.events[g.index] = deque()  # [t, mask]
        self.tracks["cpu_pct"] = _Track(self, "cpu_pct", 100)
        self.tracks["ram_used_mib"] = _Track(
            self, "ram_used_mib", None, lambda peak: memory_scale(peak, ram_total_mib, floor=512.0))
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
            own.set_top(used.top)  # both draw on one scale
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
        return "%.1f" % (-(t_last - self.window_s) * self.xs)

    def _x_marks(self) -> list[float]:
        return [self.width * f for f in (0.25, 0.5, 0.75)]

    def _y(self, value: float, top: float) -> float:
        return self.base - min(max(value, 0.0), top) * self.ys / top

    def _image(self, body: str, alt: str, threshold_y: float | None = None) -> str:
        lines = chart.frame_lines(self.width, self.height, top=_TOP, bottom=self.base, x_marks=self._x_marks())
        if threshold_y is not None:
            lines += chart.threshold_line(threshold_y, self.width)
        svg = chart.svg_document(self.width, self.height, lines + body)
        return chart.img(svg, width=self.width, height=self.height, alt=alt)

    def _cell(self, value_text: str, peak_text: str, picture: str, top: float | None, *,
              title: str = "", under: str = "") -> str:
        """A chart with its latest value (and window maximum) above and its scale beside it."""
        head = (f'<div style="display:flex;justify-content:space-between;align-items:baseline;gap:4px;'
                f'width:{self.width + _SCALE_W}px;white-space:nowrap">'
                f'<b>{_e(value_text)}</b><span style="{SMALL};{DIM}">{_e(peak_text)}</span></div>')
        if title:
            head = f'<div style="{SMALL};{DIM};white-space:nowrap">{_e(title)}</div>' + head
        scale = chart.y_scale(chart.axis_number(top), "0", self.height, width=_SCALE_W) if top else ""
        return (f'<td style="padding:3px 6px;vertical-align:top;text-align:left">{head}'
                f'<div style="display:flex">{picture}{scale}</div>{under}</td>')

    def _has_points(self, track: _Track, pending: list) -> bool:
        return bool(pending) or any(it[1] is not None for it in track.items)

    def _line(self, key: str, *, label: str, unit: str, color: str, digits: int = 0, scale: float = 1.0,
              threshold: float | None = None, threshold_words: str = "", title: str = "") -> str:
        track = self.tracks[key]
        pending = self._pending.get(key, [])
        track.fit_scale(pending)
        latest = self.latest.get(key)
        value_text = "n/a" if latest is None else f"{latest * scale:.{digits}f} {unit}".strip()
        lo, hi, gaps, n = track.stats(pending)
        peak_text = "" if hi is None else f"max {hi * scale:.{digits}f}"
        if hi is None or lo is None:  # (both or neither)
            stats = "no reading in this window"
        else:
            stats = f"latest {value_text}; min {lo * scale:,.{digits}f}, max {hi * scale:,.{digits}f} {unit}"
        if gaps:
            stats += f"; {gaps} of {n} points have no reading"
        if threshold:
            stats += f"; {threshold_words} {threshold * scale:,.{digits}f} {unit}"
        alt = f"{label}: {stats} (last {chart.span_words(self.window_s)}, scale 0 to " \
              f"{chart.axis_number(track.top * scale)} {unit})"
        if not self._has_points(track, pending):
            words = "no reading in this window" if hi is None and n else "waiting for the first samples"
            return self._cell(value_text, peak_text, chart.waiting_box(self.width, self.height, words),
                              None, title=title)
        d = _path_d((it[3] for it in track.items), track.pending_text(self._pending_t, pending, self._new_run()))
        if " " not in d:  # one point so far: a zero-length segment, drawn as a dot by its round caps
            d = f"{d} L{d[1:]}"
        body = (f'<g transform="translate({self._shift()},0)"><path d="{d}" fill="none" stroke="{color}" '
                f'stroke-width="1.5" stroke-linejoin="round" stroke-linecap="round"/></g>') if d else ""
        limit_y = self._y(threshold, track.top) if threshold and threshold <= track.top else None
        return self._cell(value_text, peak_text, self._image(body, alt, limit_y), track.top * scale, title=title)

    def _memory_bars(self, used: _Track, own: _Track, p_used: list, p_own: list) -> tuple[str, bool]:
        total = used.top
        split = any(it[1] is not None for it in own.items) or bool(p_own)
        bars_own, bars_other = [], []
        points = [(it[0], it[1], o[1]) for it, o in zip(used.items, own.items)]
        if self._pending_t is not None and p_used:
            points.append((self._pending_t, max(p_used), max(p_own) if p_own else None))
        for t, u, o in points:
            if u is None:
                continue
            x = t * self.xs
            y_used = self._y(u, total)
            if split and o is not None:
                y_own = self._y(min(o, u), total)
                bars_own.append(f"M{x:.1f},{self.base:.1f}V{y_own:.1f}")
                bars_other.append(f"M{x:.1f},{y_own:.1f}V{y_used:.1f}")
            else:
                bars_other.append(f"M{x:.1f},{self.base:.1f}V{y_used:.1f}")
        body = "".join(
            f'<path d="{" ".join(bars)}" stroke="{color}" stroke-opacity="0.85" stroke-width="{self.bar_w:.1f}"/>'
            for bars, color in ((bars_own, _COLORS["own"]), (bars_other, _COLORS["other"]))
            if bars
        )
        return (f'<g transform="translate({self._shift()},0)">{body}</g>' if body else ""), split

    def _memory(self, g: GpuSeries) -> str:
        used, own = self.memory[g.index]
        p_used, p_own = self._pending.get(used.key, []), self._pending.get(own.key, [])
        used.fit_scale(p_used)
        own.set_top(used.top)
        body, split = self._memory_bars(used, own, p_used, p_own)
        total = g.memory_total_mib
        u, o = self.latest.get(used.key), self.latest.get(own.key)
        value_text = "n/a" if u is None else f"{u / 1024:.1f} GiB"
        if u is None:
            stats = "no reading now"
        elif o is None:
            stats = f"used {u / 1024:.2f} GiB (per-process split unknown)"
        else:
            stats = f"this kernel {o / 1024:.2f} GiB, other processes {max(0.0, u - o) / 1024:.2f} GiB"
        if u is not None and total:
            stats += f", free {(total - u) / 1024:.2f} GiB of {total / 1024:.1f} GiB"
        _, hi, _, _ = used.stats(p_used)
        peak_text = "" if hi is None else f"max {hi / 1024:.1f}"
        if hi is not None:
            stats += f"; peak in window {hi / 1024:.2f} GiB"
        at_capacity = bool(total) and used.top >= (total or 0)
        alt = (f"GPU {g.index} memory: {stats} (last {chart.span_words(self.window_s)}, scale 0 to "
               f"{chart.axis_number(used.top / 1024)} GiB" + (", the capacity)" if at_capacity else ")"))
        gauge = _capacity_gauge(u, o if split else None, total, self.width)
        if not self._has_points(used, p_used):
            picture = chart.waiting_box(self.width, self.height)
            return self._cell(value_text, peak_text, picture, None, under=gauge)
        return self._cell(value_text, peak_text, self._image(body, alt), used.top / 1024, under=gauge)

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

    def gpu_label(self, g: GpuSeries) -> str:
        """The GPU column: index, name, and a line that always holds the badges' place (so
        the row does not grow when one appears): the throttle badge, and the unbalanced-GPU
        badge when the monitor's finding names this GPU."""
        state = ('<div style="color:#e0413a;font-weight:bold">lost (no readings)</div>' if g.lost else "")
        badges = [b for b in (self._badge(g.index), imbalance_badge(self.imbalance, g.index)) if b]
        badge = " ".join(badges) or f'<span style="{SMALL};{DIM}">no throttling</span>'
        return (f'<td style="padding:3px 6px;vertical-align:top;text-align:left">'
                f'<div style="font-weight:bold;white-space:nowrap">GPU {g.index}</div>'
                f'<div style="{SMALL};{DIM};max-width:{_LABEL_W}px;overflow:hidden;white-space:nowrap" '
                f'title="{_e(g.name)}">{_e(g.name)}</div>{state}'
                f'<div style="min-height:16px;margin-top:2px">{badge}</div></td>')

    def gpu_html(self, g: GpuSeries) -> str:
        """One GPU's row: its label, then memory, utilization, power, temperature, SM clock."""
        col = f"gpu{g.index}_"
        slowdown = self.slowdown_c.get(g.index)
        cells = [
            self._memory(g),
            self._line(col + "util_pct", label=f"GPU {g.index} utilization", unit="%", color=_COLORS["util"]),
            self._line(col + "power_w", label=f"GPU {g.index} power", unit="W", color=_COLORS["power"],
                       threshold=g.power_limit_w, threshold_words="power limit"),
            self._line(col + "temp_c", label=f"GPU {g.index} temperature", unit="°C", color=_COLORS["temp"],
                       threshold=slowdown, threshold_words="slowdown at"),
            self._line(col + "sm_clock_mhz", label=f"GPU {g.index} SM clock", unit="MHz", color=_COLORS["clock"]),
        ]
        return f'<tr class="gpunb-gpu">{self.gpu_label(g)}{"".join(cells)}</tr>'

    def host_html(self) -> str:
        """The host's row: CPU and RAM (RAM scaled to what is used, like GPU memory)."""
        total = self.ram_total_mib
        cores = f"{self.cpu_count} cores" if self.cpu_count else "CPU"
        ram_total = f" of {total / 1024:.1f} GiB" if total else ""
        label = (f'<td style="padding:3px 6px;vertical-align:top;text-align:left">'
                 f'<div style="font-weight:bold">Host</div><div style="{SMALL};{DIM}">{_e(cores)}'
                 f'{_e(", " + f"{total / 1024:.1f} GiB RAM") if total else ""}</div></td>')
        cells = [
            self._line("cpu_pct", label="host CPU", unit="%", color=_COLORS["cpu"], title="CPU (%), all cores"),
            self._line("ram_used_mib", label="host RAM used", unit="GiB", color=_COLORS["ram"], digits=1,
                       scale=1 / 1024, title=f"RAM used (GiB){ram_total}"),
        ]
        return f'<tr class="gpunb-host">{label}{"".join(cells)}<td colspan="3"></td></tr>'

    def header_html(self, gpus: Sequence[GpuSeries]) -> str:
        """Column titles with units and legends (limit lines dashed)."""
        split = chart.legend([(_COLORS["own"], "this kernel", False), (_COLORS["other"], "other processes", False)])
        limit = chart.legend([(chart.RED, "limit", True)]) if any(g.power_limit_w for g in gpus) else ""
        slow = chart.legend([(chart.RED, "slowdown", True)]) if any(g.temp_slowdown_c for g in gpus) else ""
        titles = [("memory (GiB)", split), ("utilization (%)", ""), ("power (W)", limit),
                  ("temperature (°C)", slow), ("SM clock (MHz)", "")]
        cells = "".join(
            f'<th style="padding:2px 6px;text-align:left;vertical-align:bottom;font-weight:600">'
            f'{_e(t)}<div style="{SMALL};font-weight:normal">{lg or "&nbsp;"}</div></th>'
            for t, lg in titles)
        return f'<tr><th></th>{cells}</tr>'

    def time_axis_html(self, columns: int, clock_text: str) -> str:
        """Time labels under every chart column: the window's start and the clock time of the
        last sample (the grid lines inside mark its quarters)."""
        labels = [f"−{chart.span_words(self.window_s)}", clock_text or "now"]
        axis = chart.time_axis(labels, self.width)
        cells = "".join(f'<td style="padding:0 6px;text-align:left">{axis}</td>' for _ in range(columns))
        return f'<tr><td style="padding:0 6px 4px 6px;text-align:left;{SMALL};{DIM}">time</td>{cells}</tr>'

    def html(
        self,
        gpus: Sequence[GpuSeries],
        *,
        nvml: Any,
        gpu_count: int,
        notes: Sequence[str] = (),
        caption_text: str = "",
        clock_text: str = "",
        holders: Mapping[int, Sequence[str]] | None = None,
        imbalance: Sequence[Any] = (),
    ) -> str:
        """The whole monitor: a row per GPU (``gpus`` gives names and lost flags now), under
        it who holds its memory (``holders``: lines per GPU index), the host row, the time
        axis, notes, a caption. ``imbalance`` (the unbalanced-GPU findings) is one line above
        the charts and a badge in each named GPU's label."""
        holders = holders or {}
        self.imbalance = tuple(imbalance)
        shown = [g for g in gpus if g.index in self.memory]
        rows = [self.header_html(shown)] if shown else []
        for g in shown:
            rows.append(self.gpu_html(g))
            held = holders_html(holders.get(g.index, ()))
            if held:
                rows.append(f'<tr><td></td><td colspan="5" style="text-align:left;padding:0 6px">{held}</td></tr>')
        if shown:
            rows.append(self.time_axis_html(5, clock_text))
        rows.append(self.host_html())
        rows.append(self.time_axis_html(2, clock_text))
        # Fixed column widths: eight GPUs line up, and nothing wraps onto its own row.
        columns = f'<col style="width:{_LABEL_W}px">' + f'<col style="width:{_CELL_W}px">' * 5
        table = (f'<table style="border-collapse:collapse;table-layout:fixed;width:{_LABEL_W + 5 * _CELL_W}px;'
                 f'border:none;margin:0"><colgroup>{columns}</colgroup>{"".join(rows)}</table>')
        parts = [imbalance_html(self.imbalance)] if self.imbalance else []
        if not gpus and not gpu_count:
            parts.append(no_gpu_html(nvml))
        parts.append(f'<div style="overflow-x:auto">{table}</div>')
        if notes:
            items = "".join(f"<li>{_e(n)}</li>" for n in notes)
            parts.append(f'<ul class="gpunb-notes" style="margin:2px 0;padding-left:18px;font-size:11px">{items}</ul>')
        if caption_text:
            parts.append(f'<div class="gpunb-caption" style="font-size:11px;{DIM}">{_e(caption_text)}</div>')
        return (f'<div class="gpunb-monitor" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:12px">'
                f'{"".join(parts)}</div>')


def _capacity_gauge(used: float | None, own: float | None, total: float | None, width: int) -> str:
    """Used memory against the whole GPU, under the chart: the capacity stays in view
    while the chart's scale follows what is used."""
    if used is None or not total:
        return ""
    parts = [(own, _COLORS["own"]), (used - own, _COLORS["other"])] if own is not None else [(used, _COLORS["other"])]
    svg = chart.stacked_bar_svg(parts, total, width, 5)
    alt = f"{used / 1024:.1f} GiB used of {total / 1024:.1f} GiB ({100 * used / total:.0f} %)"
    return (f'<div style="margin-top:2px;display:flex;align-items:center;gap:4px">'
            f'{chart.img(svg, width=width, height=5, alt=alt, css_class="gpunb-gauge")}'
            f'<span style="{SMALL};{DIM};white-space:nowrap">of {total / 1024:.0f}</span></div>')


def window_rows(window: Window) -> dict[str, list]:
    """A window's columns under the sampler's flat names (what ``SparkPanel.feed`` takes)."""
    rows: dict[str, list] = {"t_s": window.t_s, **window.host}
    for g in window.gpus:
        rows.update({f"gpu{g.index}_{name}": values for name, values in g.columns.items()})
    return rows


def series_cell(
    t: Sequence[float],
    values: Sequence[float | None],
    *,
    label: str,
    unit: str,
    span_s: float,
    y_max: float | None = None,
    color: str = chart.BLUE,
    digits: int = 0,
    hz: float | None = None,
) -> str:
    """One series as a chart cell over the last ``span_s`` seconds (latest value, scale,
    the line as an image). ``y_max`` fixes the scale (100 for percentages); without it the
    scale grows with the data."""
    if hz is None:
        hz = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else 1.0
    panel = SparkPanel(window_s=span_s, hz=hz, gpus=(), ram_total_mib=None, cpu_count=None)
    panel.tracks["x"] = _Track(panel, "x", y_max)
    panel._keys.append("x")
    panel.feed(0, {"t_s": list(t), "x": list(values)})
    return panel._line("x", label=label, unit=unit, color=color, digits=digits)


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
    """Why there is no GPU chart (``nvml`` is the NvmlStatus), and what to do."""
    if nvml.ok:
        cause = "NVML sees no GPU on this machine."
        fix = "Check `nvidia-smi`; in a container, start it with GPU access (`--gpus all`)."
    else:
        cause, fix = nvml.cause, nvml.fix
    return (
        f'<div class="gpunb-nogpu" style="margin:4px 0;padding:4px 8px;border-left:3px solid {chart.AMBER}">'
        f"<b>No GPU to show</b> — only the host is monitored. {_e(cause)}"
        f'<br><span style="{DIM}">Fix: {_e(fix)}</span></div>'
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
    shown = f"{chart.span_words(seconds)} shown"
    if state == "stopped":
        head = f"gpunb monitor · stopped at {when}" if when else "gpunb monitor · stopped"
        return f"{head} · {hz:g} Hz · {shown}"
    if state == "live":  # no "live" in the words: a saved notebook keeps this frame
        last = f"last sample {when}" if when else "waiting for the first sample"
        return f"gpunb monitor · {last} · {hz:g} Hz · {shown}"
    return f"gpunb monitor · {state} · {hz:g} Hz · {shown}"


def panel_notes(window_notes: Sequence[str], messages: Sequence[str]) -> list[str]:
    """The caller's messages (a clamped rate) and the sampler's last notes (faults)."""
    return [m for m in messages if not m.startswith("No GPU to show")] + list(window_notes[-5:])


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
    return panel.html(
        window.gpus,
        nvml=window.nvml,
        gpu_count=window.gpu_count,
        notes=panel_notes(window.notes, messages),
        caption_text=caption(state, hz=window.hz, seconds=window.seconds, started_unix=window.started_unix,
                             t_last=t_last),
        clock_text=clock_time(window.started_unix, t_last),
        holders=holders,
        imbalance=imbalance,
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
