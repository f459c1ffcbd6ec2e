"""Text and HTML for a traced cell (``%%gpumem --trace``) and the OOM doctor's allocation sites.

At a glance: the peak and the line behind most of it, the peak by role, the memory over the
cell stacked by role with the peak marked, the three largest lines. One click away: every
line with its stack, the check against torch's own peak counter, the saved file, notes.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpunb.analysis.memory.alloc_records import TRACE_ROLES, MemoryTrace
from gpunb.display import register_views
from gpunb.views import chart
from gpunb.views.markup import DIM
from gpunb.views.memory_tables import size

ROLE_COLORS = dict(zip(TRACE_ROLES, (chart.BLUE, chart.ORANGE, chart.GREEN, chart.PINK, chart.AMBER, chart.GREY),
                       strict=True))
# Bottom to top: what was there before the cell and lasts, then what a step builds up and frees.
STACK_ORDER = ("other", "parameters", "optimizer state", "gradients", "activations", "temporaries")
CHART_W, CHART_H = 520, 120
AT_A_GLANCE = 3  # lines shown before the details


def _when(t: float, unit: str) -> str:
    return f"{t:.0f} ms" if unit == "ms" else f"event {t:.0f}"


def by_role_line(by_role: dict[str, int]) -> str:
    """"activations 0.55 GiB · temporaries 0.25 GiB · …", largest first, empty roles left out."""
    parts = sorted(((n, r) for r, n in by_role.items() if n > 0), reverse=True)
    return " · ".join(f"{r} {size(n)}" for n, r in parts)


def _site_line(s: Any) -> str:
    extra = f"{s.blocks} block{'s' if s.blocks != 1 else ''}" if s.blocks else ""
    extra += (", " if extra and s.role else "") + (s.role or "")
    return f"{size(s.nbytes):>11}  {s.label}" + (f"  ({extra})" if extra else "")


def _check_line(t: MemoryTrace) -> str:
    if t.torch_peak_bytes is None:
        return ""
    same = "equal" if t.torch_peak_bytes == t.peak_bytes else "not equal"
    return (f"timeline peak {t.peak_bytes} bytes, torch.cuda.max_memory_allocated() over the cell "
            f"{t.torch_peak_bytes} bytes: {same}")


def _saved_line(t: MemoryTrace) -> str:
    if not t.saved_path:
        return ""
    return (f"snapshot saved to {t.saved_path} ({size(t.saved_bytes)}): drop it on https://pytorch.org/memory_viz "
            "to browse every event")


def trace_text(t: MemoryTrace) -> str:
    if t.unavailable:
        return f"gpunb: {t.headline}"
    lines = [f"gpunb memory trace{' of ' + t.label if t.label else ''}: {t.headline}"]
    if not t.events:
        return "\n".join(lines + [f"  {n}" for n in t.notes])
    lines.append(f"At the peak ({_when(t.peak_t, t.time_unit)}), by role: {by_role_line(t.peak_by_role)}")
    lines.append("Lines alive at the peak:")
    lines += [f"  {_site_line(s)}" for s in t.sites_at_peak]
    if t.points:
        lines.append(f"Over the cell ({t.events} allocations and frees): start {size(t.points[0].total)}, "
                     f"peak {size(t.peak_bytes)}, end {size(t.end_bytes)}")
    if t.saved_path:  # asked for: said at a glance
        lines.append(_saved_line(t))
    details = [x for x in (_check_line(t),) if x] + [f"Note: {n}" for n in t.notes]
    for s in t.sites_at_peak:
        if len(s.stack) > 1:
            details.append(f"{s.label} called from: " + " → ".join(s.stack[:-1]))
    if details:
        lines.append("Details:")
        lines += [f"  {d}" for d in details]
    return "\n".join(lines)


def _peak_index(t: MemoryTrace) -> int:
    """The first point at the peak (the largest total when the peak came from torch's counter)."""
    pts = t.points
    at = [i for i, p in enumerate(pts) if p.total == t.peak_bytes]
    return at[0] if at else max(range(len(pts)), key=lambda i: pts[i].total)


def timeline_svg(t: MemoryTrace, width: int = CHART_W, height: int = CHART_H) -> tuple[str, float] | None:
    """The memory over the cell, one band per role stacked from 0, the peak as a dashed line with
    a dot at its level. x is the order of the allocations and frees, not the clock: a cell's steps
    often take the last few ms after a slow first step (the H200 recording: steps 2 and 3 in the
    last 4 of 394 ms), and on a clock the peak would be a sliver a few pixels wide."""
    pts = t.points
    if len(pts) < 2:
        return None
    last = len(pts) - 1
    high = max(max(p.total for p in pts), 1)
    unit = 2**30 if high >= 2**30 else 2**20
    top = chart.nice_ceiling(high / unit) * unit
    pad_top, base = 4.0, height - 1.0

    def x(i: float) -> float:
        return (width - 1) * i / last

    def y(v: float) -> float:
        return base - (base - pad_top) * v / top

    body = [chart.frame_lines(width, height, top=pad_top, bottom=base, x_marks=[width * f for f in (0.25, 0.5, 0.75)])]
    # a level holds until the next event: steps, not slopes
    edges = [(x(i), x(i + 1) if i < last else float(width - 1)) for i in range(len(pts))]
    below = [0] * len(pts)
    for role in STACK_ORDER:
        k = TRACE_ROLES.index(role)
        above = [b + p.by_role[k] for b, p in zip(below, pts, strict=True)]
        if any(p.by_role[k] for p in pts):
            upper = " ".join(f"{a:.1f},{y(v):.1f} {b:.1f},{y(v):.1f}" for (a, b), v in zip(edges, above, strict=True))
            lower = " ".join(f"{b:.1f},{y(v):.1f} {a:.1f},{y(v):.1f}"
                             for (a, b), v in reversed(list(zip(edges, below, strict=True))))
            body.append(f'<polygon points="{upper} {lower}" fill="{ROLE_COLORS[role]}" fill-opacity="0.85"/>')
        below = above
    i = _peak_index(t)
    px, py = (edges[i][0] + edges[i][1]) / 2, y(pts[i].total)
    body.append(f'<path d="M{px:.1f},{pad_top}V{base}" stroke="{chart.RED}" stroke-width="1.2" '
                f'stroke-dasharray="4 3"/>')
    body.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{chart.RED}"/>')
    return chart.svg_document(width, height, "".join(body)), top


def _timeline_html(t: MemoryTrace) -> str:
    drawn = timeline_svg(t)
    if drawn is None:
        return ""
    svg, top = drawn
    items = [(ROLE_COLORS[r], r, False) for r in reversed(STACK_ORDER)
             if any(p.by_role[TRACE_ROLES.index(r)] for p in t.points)]
    items.append((chart.RED, f"peak {size(t.peak_bytes)}", True))
    words = (f"memory by role over the cell's {t.events} allocations and frees in order, scale 0 to {size(top)}: "
             f"start {size(t.points[0].total)}, peak {size(t.peak_bytes)} at {_when(t.peak_t, t.time_unit)}, "
             f"end {size(t.end_bytes)}")
    image = chart.img(svg, width=CHART_W, height=CHART_H, alt=words)
    return (f'<div style="margin-top:6px"><div style="{chart.SMALL}">{chart.legend(items)}</div>'
            f'<div style="display:flex">{image}{chart.y_scale(size(top), "0", CHART_H, width=70)}</div>'
            f'{chart.time_axis(["0", "allocations and frees, in order", str(t.events)], CHART_W)}'
            "</div>")


_P = "margin:3px 0"
_TD = "padding:1px 8px;text-align:left;vertical-align:top;border-bottom:1px solid rgba(140,149,159,0.35)"


def _sites_table(sites: Any, *, stacks: bool) -> str:
    """Size and role never wrap; the line of code takes the rest of the width."""
    called = stacks and any(len(s.stack) > 1 for s in sites)
    roles = any(s.role for s in sites)
    head = ["size", "line"] + (["role"] if roles else []) + (["blocks"] if stacks else []) + \
        (["called from"] if called else [])
    rows = []
    for s in sites:
        cells = [(size(s.nbytes), True), (s.label, False)] + ([(s.role, True)] if roles else [])
        if stacks:
            cells.append((str(s.blocks) if s.blocks else "", True))
        if called:
            cells.append((" → ".join(s.stack[:-1]), False))
        rows.append("<tr>" + "".join(f"<td style='{_TD}{';white-space:nowrap' if keep else ''}'>{escape(c)}</td>"
                                     for c, keep in cells) + "</tr>")
    th = "".join(f"<th style='{_TD};white-space:nowrap'>{escape(h)}</th>" for h in head)
    return (f"<table style='font-family:var(--jp-code-font-family,monospace);font-size:12px;"
            f"border-collapse:collapse'><tr>{th}</tr>{''.join(rows)}</table>")


def trace_html(t: MemoryTrace) -> str:
    box = ("<div class='gpunb-trace' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
           "overflow-wrap:anywhere'>")
    head = f"<div style='font-size:14px'><b>gpunb memory trace</b>: <b>{escape(t.headline)}</b></div>"
    if t.unavailable or not t.events:
        return box + head + "".join(f"<div style='{_P};{DIM}'>{escape(n)}</div>" for n in t.notes) + "</div>"
    parts = [box, head,
             f"<div style='{_P}'>At the peak, by role: {escape(by_role_line(t.peak_by_role))}</div>",
             _timeline_html(t)]
    glance = t.sites_at_peak[:AT_A_GLANCE]
    parts.append(f"<div style='{_P}'><b>Lines alive at the peak</b></div>" + _sites_table(glance, stacks=False))
    if t.saved_path:
        parts.append(f"<div style='{_P};{DIM}'>{escape(_saved_line(t))}</div>")
    inner = []
    if len(t.sites_at_peak) > len(glance) or any(len(s.stack) > 1 for s in t.sites_at_peak):
        inner.append(_sites_table(t.sites_at_peak, stacks=True))
    inner += [f"<div style='{_P}'>{escape(x)}</div>" for x in (_check_line(t),) if x]
    inner += [f"<div style='{_P}'>Note: {escape(n)}</div>" for n in t.notes]
    inner.append(f"<div style='{_P};{DIM}'>How roles are decided: docs/memory-trace.md. {t.events} allocations "
                 "and frees recorded.</div>")
    parts.append("<details style='margin:4px 0'><summary style='cursor:pointer'>Details: every line with its "
                 "stack, the check against torch's peak, notes</summary>" + "".join(inner) + "</details>")
    return "".join(parts) + "</div>"


# -- the OOM doctor's allocation sites (a part of its diagnosis) ------------------------------------

def oom_sites_lines(sites: Any) -> list[str]:
    """"The failed request: In [6] line 2: …", then the largest live blocks by line."""
    if sites is None:
        return []
    lines = []
    if sites.failed_at:
        asked = f" ({size(sites.requested_bytes)})" if sites.requested_bytes else ""
        lines.append(f"Failed request{asked}: {sites.failed_at}")
    if sites.live:
        lines.append("Largest live memory by line:")
        lines += [f"  {size(s.nbytes):>11}  {s.label}" for s in sites.live[:AT_A_GLANCE]]
    return lines


def oom_sites_html(sites: Any) -> str:
    """The failed request's line, then the largest live lines as a table, size first (in a
    sentence the size came after a long line of code, where the eye does not find it)."""
    if sites is None:
        return ""
    parts = []
    if sites.failed_at:
        asked = f"<b>{escape(size(sites.requested_bytes))}</b> " if sites.requested_bytes else ""
        parts.append(f"<div style='{_P}'><b>Failed request:</b> {asked}at {escape(sites.failed_at)}</div>")
    if sites.live:
        parts.append(f"<div style='{_P}'><b>Largest live memory by line</b></div>"
                     + _sites_table(sites.live[:AT_A_GLANCE], stacks=False))
    return "".join(parts)


register_views(MemoryTrace, {"text/plain": trace_text, "text/html": trace_html})
