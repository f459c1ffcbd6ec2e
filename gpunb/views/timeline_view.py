"""The memory timeline of a profiled cell: torch's allocated and reserved memory (RSS on a CPU)
over the cell, the optimizer steps as ticks; a data-URI image that untrusted notebooks keep."""

from __future__ import annotations

from html import escape

from gpunb.analysis.profile.records import CellProfile
from gpunb.units import gib, seconds
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL

TIMELINE_W, TIMELINE_H = 520, 80


def fmt_bytes(n: int | float | None) -> str:
    return gib(n, digits=2)


def timeline_svg(p: CellProfile, width: int = TIMELINE_W, height: int = TIMELINE_H) -> tuple[str, float] | None:
    """Memory over the cell on a scale from 0 (a few MiB of change stay a few MiB), step
    ends as ticks along the baseline. Returns the SVG and the scale's top in bytes."""
    pts = p.memory_timeline
    if len(pts) < 2:
        return None
    t_end = max(max(t for t, _, _ in pts), p.wall_s, 1e-9)
    high = max(max(a for _, a, _ in pts), max((r or 0) for _, _, r in pts), 1)
    unit = 2**30 if high >= 2**30 else 2**20  # a round number of GiB, or of MiB below 1 GiB
    top = chart.nice_ceiling(high / unit) * unit
    pad_top, base = 2.0, height - 1.0

    def xy(t: float, v: float) -> str:
        return f"{(width - 1) * t / t_end:.1f},{base - (base - pad_top) * v / top:.1f}"

    body = [chart.frame_lines(width, height, top=pad_top, bottom=base,
                              x_marks=[width * f for f in (0.25, 0.5, 0.75)])]
    marks = p.step_marks_s
    step = max(1, len(marks) // 200)  # at most ~200 ticks
    ticks = " ".join(f"M{(width - 1) * t / t_end:.1f},{base}v-5" for t in marks[::step])
    if ticks:
        body.append(f'<path d="{ticks}" stroke="{chart.NEUTRAL}" stroke-opacity="0.9" stroke-width="1"/>')
    if any(r is not None for _, _, r in pts):
        reserved = " ".join(xy(t, r) for t, _, r in pts if r is not None)
        body.append(f'<polyline points="{reserved}" fill="none" stroke="{chart.ORANGE}" stroke-width="1.5"/>')
    alloc = " ".join(xy(t, a) for t, a, _ in pts)
    body.append(f'<polyline points="{alloc}" fill="none" stroke="{chart.BLUE}" stroke-width="1.5"/>')
    return chart.svg_document(width, height, "".join(body)), top


def timeline_html(p: CellProfile) -> str:
    drawn = timeline_svg(p) if p.extra.get("timeline", True) else None
    if drawn is None:
        return ""
    svg, top = drawn
    pts = p.memory_timeline
    on_gpu = p.gpu is not None
    values = [a for _, a, _ in pts]
    what = "allocated by torch" if on_gpu else "resident memory (RSS)"
    words = (f"{what}: start {fmt_bytes(values[0])}, lowest {fmt_bytes(min(values))}, "
             f"peak {fmt_bytes(max(values))}, end {fmt_bytes(values[-1])}")
    reserved = [r for _, _, r in pts if r is not None]
    if reserved:
        words += f" · reserved: peak {fmt_bytes(max(reserved))}, end {fmt_bytes(reserved[-1])}"
    items = [(chart.BLUE, "allocated" if on_gpu else "RSS", False)]
    if reserved:
        items.append((chart.ORANGE, "reserved", False))
    items.append((chart.NEUTRAL, f"{len(p.step_marks_s)} optimizer steps (ticks)", False))
    t_end = max(max(t for t, _, _ in pts), p.wall_s, 1e-9)
    image = chart.img(svg, width=TIMELINE_W, height=TIMELINE_H,
                      alt=f"memory over the cell, scale 0 to {fmt_bytes(top)}; {words}", css_class="gpunb-chart")
    return (f'<div class="gpunb-timeline" style="margin-top:8px">'
            f'<div><b>Memory over the cell</b> <span style="{SMALL}">{chart.legend(items)}</span></div>'
            f'<div style="{SMALL};{DIM};margin-bottom:2px">{escape(words)}</div>'
            f'<div style="display:flex">{image}{chart.y_scale(fmt_bytes(top), "0", TIMELINE_H, width=70)}</div>'
            f'{chart.time_axis(["0 s", seconds(t_end / 2), seconds(t_end)], TIMELINE_W)}</div>')
