"""Charts that survive wherever a notebook goes: SVG drawn here, shown as a data-URI ``<img>``.

JupyterLab's sanitizer removes inline ``<svg>`` from the HTML of an untrusted notebook (one
opened from git, from a colleague, a workshop handout); an ``<img src="data:image/svg+xml;base64,...">``
stays, and so does it in Notebook 7, VS Code, nbconvert's HTML and a terminal's text view
(where the ``alt`` text is what a screen reader reads). So every gpunb chart is an image.

Colours: CSS variables do not reach into an image, so what is drawn inside one uses colours
with enough contrast on a white page and on JupyterLab's and VS Code's dark backgrounds
(``tests/test_charts.py`` holds every one above 3:1 on all three, the WCAG level for
graphics). Words (values, scales, time labels, legends) stay in the HTML around the image,
where they take the theme's own text colour; secondary words are dimmed with ``opacity``
rather than a fixed grey, so they stay readable on any background.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from html import escape

from gpunb.views.markup import DIM  # secondary words: the theme's colour, dimmed

# Series colours (relative luminance 0.19-0.27: between white and #111 in contrast).
BLUE = "#3b7dd8"
ORANGE = "#e06c00"
GREEN = "#1a9e5c"
AMBER = "#a88400"
PINK = "#d63c7a"
PURPLE = "#9b6bd6"
TEAL = "#0f8b8d"
GREY = "#7d8590"
RED = "#e0413a"  # limits and thresholds (dashed), failures
NEUTRAL = "#8c959f"  # baselines and grid lines, drawn half transparent

BACKGROUNDS = {"light": "#ffffff", "JupyterLab dark": "#111111", "VS Code dark": "#1e1e1e"}
SERIES_COLORS = (BLUE, ORANGE, GREEN, AMBER, PINK, PURPLE, TEAL, GREY, RED)

SMALL = "font-size:10px;line-height:1.15"


def data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def img(svg: str, *, width: int, height: int, alt: str, css_class: str = "gpunb-chart") -> str:
    """``svg`` as an ``<img>`` that the sanitizer keeps; ``alt`` (also the hover title)
    says in words what the chart shows."""
    words = escape(alt, quote=True)
    return (f'<img class="{css_class}" src="{data_uri(svg)}" width="{width}" height="{height}" '
            f'alt="{words}" title="{words}" style="display:block;max-width:none">')


def svg_document(width: int, height: int, body: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{body}</svg>')


def frame_lines(width: int, height: int, *, top: float, bottom: float, x_marks: Iterable[float] = ()) -> str:
    """A baseline at ``bottom``, a dotted line at the scale's top, vertical grid lines at ``x_marks``."""
    parts = [f'<path d="M0,{bottom:.1f}H{width}" stroke="{NEUTRAL}" stroke-opacity="0.8" stroke-width="1"/>',
             f'<path d="M0,{top:.1f}H{width}" stroke="{NEUTRAL}" stroke-opacity="0.45" stroke-width="1" '
             f'stroke-dasharray="2 3"/>']
    xs = " ".join(f"M{x:.1f},{top:.1f}V{bottom:.1f}" for x in x_marks)
    if xs:
        parts.append(f'<path d="{xs}" stroke="{NEUTRAL}" stroke-opacity="0.3" stroke-width="1"/>')
    return "".join(parts)


def threshold_line(y: float, width: int, color: str = RED) -> str:
    return (f'<path d="M0,{y:.1f}H{width}" stroke="{color}" stroke-width="1.2" stroke-dasharray="4 3" '
            f'stroke-opacity="0.9"/>')


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten that is >= ``value``
    (an axis top a reader can take in at a glance)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10 * power


def axis_number(value: float) -> str:
    """A scale label: 140, 1.5, 0.25 (no trailing zeros, thousands without separators)."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:.1f}".rstrip("0").rstrip(".")


def span_words(seconds: float) -> str:
    """A duration for an axis: 30 s, 2 min, 1.5 h."""
    if seconds >= 3600:
        return f"{axis_number(seconds / 3600)} h"
    if seconds >= 60:
        return f"{axis_number(seconds / 60)} min"
    return f"{axis_number(seconds)} s"


def swatch(color: str, *, dashed: bool = False) -> str:
    """A legend mark: a filled square, a hollow one (no colour: what stays empty, like free
    memory), or a short dashed line for a limit."""
    if dashed:
        style = f"display:inline-block;width:12px;height:0;border-top:2px dashed {color};vertical-align:middle"
    elif not color:
        style = (f"display:inline-block;width:9px;height:9px;box-sizing:border-box;border:1px solid {NEUTRAL};"
                 "vertical-align:middle")
    else:
        style = f"display:inline-block;width:9px;height:9px;background-color:{color};vertical-align:middle"
    return f'<span style="{style}"></span>'


def legend(items: Sequence[tuple[str, str, bool]]) -> str:
    """(colour, words, dashed) marks in a row."""
    return " ".join(f'<span style="white-space:nowrap">{swatch(c, dashed=d)} '
                    f'<span style="{DIM}">{escape(w)}</span></span>' for c, w, d in items)


def y_scale(top_label: str, bottom_label: str, height: int, width: int = 30) -> str:
    """The scale's top and bottom values beside a chart of ``height`` pixels."""
    return (f'<div style="display:flex;flex-direction:column;justify-content:space-between;height:{height}px;'
            f'width:{width}px;padding-left:3px;{SMALL};{DIM}"><span>{escape(top_label)}</span>'
            f'<span>{escape(bottom_label)}</span></div>')


def time_axis(labels: Sequence[str], width: int) -> str:
    """Labels spread evenly under a chart of ``width`` pixels (first at the left edge, last at the right)."""
    spans = "".join(f'<span style="white-space:nowrap">{escape(t)}</span>' for t in labels)
    return (f'<div style="display:flex;justify-content:space-between;width:{width}px;{SMALL};{DIM}">'
            f"{spans}</div>")


def waiting_box(width: int, height: int, words: str = "waiting for the first samples") -> str:
    """What stands where a chart will be, before there is anything to draw (same size: no jump)."""
    return (f'<div style="width:{width}px;height:{height}px;box-sizing:border-box;border:1px dashed {NEUTRAL};'
            f'display:flex;align-items:center;justify-content:center;{SMALL};{DIM}">{escape(words)}</div>')


def stacked_bar_svg(parts: Sequence[tuple[float, str]], total: float, width: int, height: int) -> str:
    """One horizontal bar split into (value, colour) parts, scaled to ``total``."""
    x = 0.0
    rects = []
    for value, color in parts:
        if not value or value <= 0 or total <= 0:
            continue
        w = width * min(value, total) / total
        rects.append(f'<rect x="{x:.2f}" y="0" width="{max(w, 0.8):.2f}" height="{height}" fill="{color}"/>')
        x += w
    outline = (f'<rect x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" fill="none" '
               f'stroke="{NEUTRAL}" stroke-opacity="0.8"/>')
    return svg_document(width, height, "".join(rects) + outline)
