"""The monitor's charts: sampler rows in, one panel per reading out (a chart with its title,
latest value, window maximum, scale and time axis).

:class:`SparkPanel` is fed rows as the sampler adds them and draws every panel of a frame;
how the panels are laid out (a block per GPU, the host, notes, caption) is
:mod:`gpunb.views.monitor_layout`. Each chart is an SVG shown as a data-URI ``<img>``
(:mod:`gpunb.views.chart`: it survives untrusted notebooks, saving and nbconvert); the words
around it are HTML in the theme's own colours. The time axis starts at the first sample
until the window is full, so a 34 s run fills the chart instead of its right quarter.
Every dynamic string is escaped (GPU names and notes are not ours).
"""

from __future__ import annotations

import html
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpunb.analysis.monitor.series import GpuSeries
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL

# Plot pixels of one chart: large enough to read a value off its scale (the first version's
# 100x38 px were not), small enough that five panels (5 x 170 px + gaps = 874 px) sit side by
# side in the 934 px JupyterLab leaves at 1366 px with its file browser open; narrower windows
# wrap the panels (monitor_layout), never cut them off.
WIDTH = 126
HEIGHT = 56
# Points per chart (a point per 1.8 px): rows beyond that are merged into buckets. Not one per
# pixel: every point is formatted on the sampler thread, which holds the GIL while it draws.
MAX_POINTS = 100
# Until the window is full the time axis spans the samples so far, but at least this long
# (two samples a second apart must not fill a chart as if they were a trend).
MIN_SPAN_S = 10.0
_TOP = 2.0  # the scale's top is drawn this far below the image's edge (a line there stays whole)
_SCALE_W = 30  # the scale's numbers beside a chart
PANEL_W = WIDTH + _SCALE_W + 14  # one panel: chart, its scale, padding
_PANEL_STYLE = (f"box-sizing:border-box;width:{PANEL_W}px;padding:4px 6px 3px 6px;border-radius:4px;"
                "border:1px solid rgba(140,149,159,0.35)")
MEMORY_FLOOR_MIB = 1024.0  # a memory scale never shows less than 1 GiB
# A series read in turns (PCIe, traffic.py) shows its last reading this long, then "n/a".
SEEN_FOR_S = 10.0
# How a chart of several lines (one per GPU) makes its one large number, and the words its title
# ends with. Only aggregates that stay on the lines' own scale: a sum over eight GPUs is no point
# on a per-GPU axis ("17.7 GiB · max 8.8", "114 GB/s" on an 80 GB/s axis), so there is no "sum".
# The "max" beside the number is the window's highest value of the same aggregate.
AGGREGATES: dict[str, Callable[[list[float]], float]] = {"max": max, "mean": statistics.fmean, "min": min}
COLORS = {
    "own": chart.BLUE,
    "other": chart.ORANGE,
    "util": chart.GREEN,
    "power": chart.AMBER,
    "temp": chart.PINK,
    "clock": chart.PURPLE,
    "cpu": chart.TEAL,
    "ram": chart.GREY,
}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


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
                 scale: Callable[[float | None], float] | None = None, hold_s: float | None = None) -> None:
        self.panel = panel
        self.key = key
        self.scale = scale
        self.fixed = bool(top)
        self.top = float(top) if top else (scale(None) if scale else 1.0)
        self.items: deque[list] = deque()  # [t, vmax, vmin, text]; text "" marks a gap
        self.prev_gap = True
        # A series read in turns (PCIe: eight GPUs take turns) has empty buckets between its
        # readings; they do not break its line while the last reading is this recent. Without
        # it every reading was a lone "M" point, and eight GPUs' PCIe charts drew nothing.
        self.hold_s = hold_s
        self.last_value_t: float | None = None

    def _text(self, t: float, v: float, new_run: bool) -> str:
        p = self.panel
        v = self.top if v > self.top else (v if v > 0 else 0.0)
        return f"{'M' if new_run else 'L'}{t * p.xs:.1f},{p.base - v * p.ys / self.top:.1f}"

    def _held(self, t: float) -> bool:
        """Whether an empty bucket at ``t`` continues the line (a series read in turns)."""
        return self.hold_s is not None and self.last_value_t is not None and t - self.last_value_t <= self.hold_s

    def add(self, t: float, values: list, new_run: bool) -> None:
        if not values:
            self.items.append([t, None, None, ""])
            self.prev_gap = self.prev_gap or not self._held(t)
            return
        if self.hold_s is not None and not self._held(t):
            self.prev_gap = True
        self.last_value_t = t
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
        for item in self.items:  # each point keeps whether it starts a run ("M"), decided when added
            if item[1] is not None:
                item[3] = self._text(item[0], item[1], item[3].startswith("M"))

    def fit_scale(self, pending: list) -> None:
        """Rescale to the window's peak (it may have scrolled out since the last frame)."""
        if self.scale is not None:
            self.set_top(self.scale(self.stats(pending)[1]))

    def pending_text(self, t: float | None, values: list, new_run: bool) -> str:
        if t is None or not values:
            return ""
        return self._text(t, max(values), new_run or self.prev_gap or (self.hold_s is not None and not self._held(t)))

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
        self.t_first: float | None = None  # the first sample fed: the time axis starts there until full
        self.t_last: float | None = None
        self._bucket: int | None = None
        self._pending: dict[str, list] = {}
        self._pending_t: float | None = None
        self._prev_t: float | None = None
        self.tracks: dict[str, _Track] = {}
        self.memory: dict[int, tuple[_Track, _Track]] = {}
        self.events: dict[int, deque] = {}
        self.latest: dict[str, Any] = {}
        self.seen: dict[str, tuple[float, float]] = {}  # key -> (t, value) of its last reading
        self.slowdown_c: dict[int, float | None] = {}
        self.clock_text = ""  # the last sample's clock time, at the right end of each time axis
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
            if g.links is not None:  # the link charts (views/links_view.py), each against its limit
                limits = [("pcie_rx_gbs", g.links.pcie_rx.gbs), ("pcie_tx_gbs", g.links.pcie_tx.gbs)]
                if g.links.nvlink is not None:
                    limits.append(("nvlink_rx_gbs", g.links.nvlink.gbs))
                for name, limit in limits:
                    top = chart.nice_ceiling(limit * 1.08) if limit else None  # room above the limit line
                    held = SEEN_FOR_S if name.startswith("pcie") else None  # PCIe is read in turns
                    self.tracks[col + name] = _Track(self, col + name, top, hold_s=held)
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
                    self.seen[k] = (t, v)
            self._pending_t = t
            self.next_index = n + 1
            self.t_last = t
            if self.t_first is None:
                self.t_first = t
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
    def span_s(self) -> float:
        """Seconds the time axis shows: the window once it is full, before that the samples
        so far (at least MIN_SPAN_S), so a short run fills the chart."""
        if self.t_first is None or self.t_last is None:
            return min(self.window_s, MIN_SPAN_S)
        return min(self.window_s, max(self.t_last - self.t_first, MIN_SPAN_S))

    def _placement(self) -> str:
        """The SVG transform that puts the stored points (x = t * xs, formatted once) on the
        shown span: shift its start to 0, stretch it to the width. Lines keep their stroke
        width (``non-scaling-stroke``); memory bars widen with their bucket, as they should."""
        span = self.span_s()
        start = (self.t_last or 0.0) - span
        stretch = self.window_s / span
        if stretch == 1:
            return f"translate({-start * self.xs:.1f},0)"
        return f"scale({stretch:.4f},1) translate({-start * self.xs:.1f},0)"

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
              title: str = "", legend: str = "", under: str = "", keys: Sequence[str] = (),
              aggregate: str = "latest", scale: float = 1.0) -> str:
        """One panel: its title (with a legend), the latest value large with the window's
        maximum beside it, the chart with its scale, the time axis, and ``under`` (a gauge).
        ``keys``, ``aggregate`` and ``scale`` say which series the large number is made of and
        how (data attributes: a test recomputes it from the sampler's record)."""
        data = (f' data-series="{_e(" ".join(keys))}" data-aggregate="{_e(aggregate)}" data-scale="{scale!r}"'
                if keys else "")
        head = f'<div style="{SMALL}">'
        head += f'<b style="font-weight:600">{_e(title)}</b>' + (f" {legend}" if legend else "") + "</div>"
        head += (f'<div style="display:flex;justify-content:space-between;align-items:baseline;gap:4px;'
                 f'white-space:nowrap"><b style="font-size:15px">{_e(value_text)}</b>'
                 f'<span style="{SMALL};{DIM}">{_e(peak_text)}</span></div>')
        y_scale = chart.y_scale(chart.axis_number(top), "0", self.height, width=_SCALE_W) if top else ""
        axis = chart.time_axis([f"−{chart.span_words(round(self.span_s()))}", self.clock_text or "now"], self.width)
        return (f'<div class="gpunb-panel" style="{_PANEL_STYLE}"{data}>{head}'
                f'<div style="display:flex">{picture}{y_scale}</div>{axis}{under}</div>')

    def _has_points(self, track: _Track, pending: list) -> bool:
        return bool(pending) or any(it[1] is not None for it in track.items)

    def line(self, key: str, *, label: str, unit: str, color: str, digits: int = 0, scale: float = 1.0,
              threshold: float | None = None, threshold_words: str = "", title: str = "", legend: str = "") -> str:
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
        alt = f"{label}: {stats} (last {chart.span_words(round(self.span_s()))}, scale 0 to " \
              f"{chart.axis_number(track.top * scale)} {unit})"
        if not self._has_points(track, pending):
            words = "no reading in this window" if hi is None and n else "waiting for the first samples"
            return self._cell(value_text, peak_text, chart.waiting_box(self.width, self.height, words),
                              None, title=title or label, legend=legend, keys=[key], scale=scale)
        d = _path_d((it[3] for it in track.items), track.pending_text(self._pending_t, pending, self._new_run()))
        if " " not in d:  # one point so far: a zero-length segment, drawn as a dot by its round caps
            d = f"{d} L{d[1:]}"
        body = (f'<g transform="{self._placement()}"><path d="{d}" fill="none" stroke="{color}" '
                f'stroke-width="1.5" stroke-linejoin="round" stroke-linecap="round" '
                f'vector-effect="non-scaling-stroke"/></g>') if d else ""
        limit_y = self._y(threshold, track.top) if threshold and threshold <= track.top else None
        return self._cell(value_text, peak_text, self._image(body, alt, limit_y), track.top * scale,
                          title=title or label, legend=legend, keys=[key], scale=scale)

    def recent(self, key: str) -> float | None:
        """The last reading of ``key`` if it is recent (series read in turns have gaps between)."""
        got = self.seen.get(key)
        return got[1] if got is not None and self.t_last is not None and self.t_last - got[0] <= SEEN_FOR_S else None

    def multi_line(self, series: Sequence[tuple[str, str, str]], *, label: str, unit: str, title: str,
                   threshold: float | None = None, threshold_words: str = "", legend: str = "",
                   digits: int = 1, under: str = "", scale: float = 1.0, aggregate: str = "max",
                   aggregate_words: str = "") -> str:
        """Several series on one chart and scale (``series``: key, colour, name, e.g. one per GPU).
        The large value is one number on that scale: the ``aggregate`` (AGGREGATES) of the series'
        latest readings, which the title names (``aggregate_words``: "hottest GPU") when there are
        several; beside it the window's maximum of the same aggregate. The alt text names each
        series. ``scale`` converts readings to ``unit`` (MiB to GiB)."""
        combine = AGGREGATES[aggregate]
        memory = {pair[0].key: pair[0] for pair in self.memory.values()}  # used memory, for the overview
        tracks = [(self.tracks.get(k) or memory[k], color, name) for k, color, name in series
                  if k in self.tracks or k in memory]
        if len(tracks) > 1 and aggregate_words:
            title = f"{title}, {aggregate_words}"
        for track, _, _ in tracks:
            track.fit_scale(self._pending.get(track.key, []))
        top = max([t.top for t, _, _ in tracks] + [threshold * 1.08 if threshold else 0.0])
        paths, parts = [], []
        for track, color, name in tracks:
            track.set_top(top)
            pending = self._pending.get(track.key, [])
            now = self.recent(track.key)
            parts.append(f"{name} {'n/a' if now is None else f'{now * scale:,.{digits}f} {unit}'}")
            d = _path_d((it[3] for it in track.items), track.pending_text(self._pending_t, pending, self._new_run()))
            if d and " " not in d:
                d = f"{d} L{d[1:]}"
            if d:
                paths.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5" stroke-linejoin="round" '
                             f'stroke-linecap="round" vector-effect="non-scaling-stroke"/>')
        values = [v * scale for t, _, _ in tracks if (v := self.recent(t.key)) is not None]
        now = combine(values) if values else None
        value_text = "n/a" if now is None else f"{now:,.{digits}f} {unit}"
        peak = self._aggregate_peak([t for t, _, _ in tracks], combine)
        peak_text = "" if peak is None else f"max {peak * scale:,.{digits}f}"
        stats = "; ".join(parts) if parts else "no reading"
        if threshold:
            stats += f"; {threshold_words} {threshold * scale:,.{digits}f} {unit}"
        alt = (f"{label}: {stats} (last {chart.span_words(round(self.span_s()))}, scale 0 to "
               f"{chart.axis_number(top * scale)} {unit})")
        keys = [t.key for t, _, _ in tracks]
        if peak is None:
            words = "no reading in this window" if self.t_last is not None else "waiting for the first samples"
            return self._cell(value_text, peak_text, chart.waiting_box(self.width, self.height, words), None,
                              title=title, legend=legend, under=under, keys=keys, aggregate=aggregate, scale=scale)
        body = f'<g transform="{self._placement()}">{"".join(paths)}</g>'
        limit_y = self._y(threshold, top) if threshold and threshold <= top else None
        return self._cell(value_text, peak_text, self._image(body, alt, limit_y), top * scale, title=title,
                          legend=legend, under=under, keys=keys, aggregate=aggregate, scale=scale)

    def _aggregate_peak(self, tracks: Sequence[_Track], combine: Callable[[list[float]], float]) -> float | None:
        """The window's highest value of ``combine`` over the tracks, bucket by bucket (a bucket's
        value per track is its largest reading; series read in turns join with whatever they have)."""
        by_t: dict[float, list[float]] = {}
        for track in tracks:
            for t, vmax, _, _ in track.items:
                if vmax is not None:
                    by_t.setdefault(t, []).append(vmax)
            pending = self._pending.get(track.key, [])
            if pending and self._pending_t is not None:
                by_t.setdefault(self._pending_t, []).append(max(pending))
        return max((combine(vs) for vs in by_t.values()), default=None)

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
            for bars, color in ((bars_own, COLORS["own"]), (bars_other, COLORS["other"]))
            if bars
        )
        return (f'<g transform="{self._placement()}">{body}</g>' if body else ""), split

    def memory_panel(self, g: GpuSeries, *, legend: str = "") -> str:
        """The memory panel: used memory as bars split into this kernel and other processes,
        on a scale that follows what is used, and a gauge against the whole GPU under it."""
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
        alt = (f"GPU {g.index} memory: {stats} (last {chart.span_words(round(self.span_s()))}, scale 0 to "
               f"{chart.axis_number(used.top / 1024)} GiB" + (", the capacity)" if at_capacity else ")"))
        gauge = capacity_gauge(u, o if split else None, total, self.width)
        if not self._has_points(used, p_used):
            picture = chart.waiting_box(self.width, self.height)
            return self._cell(value_text, peak_text, picture, None, title="memory (GiB)", legend=legend, under=gauge,
                              keys=[used.key], scale=1 / 1024)
        return self._cell(value_text, peak_text, self._image(body, alt), used.top / 1024, title="memory (GiB)",
                          legend=legend, under=gauge, keys=[used.key], scale=1 / 1024)


def capacity_gauge(used: float | None, own: float | None, total: float | None, width: int) -> str:
    """Used memory against the whole GPU, under the chart: the capacity stays in view
    while the chart's scale follows what is used."""
    if used is None or not total:
        return ""
    parts = [(own, COLORS["own"]), (used - own, COLORS["other"])] if own is not None else [(used, COLORS["other"])]
    svg = chart.stacked_bar_svg(parts, total, width, 5)
    alt = f"{used / 1024:.1f} GiB used of {total / 1024:.1f} GiB ({100 * used / total:.0f} %)"
    return (f'<div style="margin-top:2px;display:flex;align-items:center;gap:4px">'
            f'{chart.img(svg, width=width, height=5, alt=alt, css_class="gpunb-gauge")}'
            f'<span style="{SMALL};{DIM};white-space:nowrap">of {total / 1024:.0f}</span></div>')


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
    return panel.line("x", label=label, unit=unit, color=color, digits=digits)
