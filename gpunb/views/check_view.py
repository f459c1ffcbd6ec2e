"""The check report as plain text (terminals, logs) and as HTML (notebooks, nbconvert).

Both come from the same records; every dynamic string in HTML is escaped, because GPU
process names, paths and error messages are not ours to trust.
"""

from __future__ import annotations

import textwrap
from html import escape

from gpunb.analysis.checks.records import CheckReport, CheckResult
from gpunb.display import register_views
from gpunb.units import seconds
from gpunb.views import chart
from gpunb.views.markup import DIM, code_html

SYMBOL = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "–"}
# Readable on light and dark backgrounds alike (gpunb.views.chart's palette).
COLOR = {"ok": chart.GREEN, "warn": chart.ORANGE, "fail": chart.RED, "skip": chart.GREY}
NAMED = 3  # checks named in the headline before "and N more"


def _names(checks: list[CheckResult]) -> str:
    titles = [c.title for c in checks[:NAMED]]
    more = len(checks) - NAMED
    return "; ".join(titles) + (f"; and {more} more" if more > 0 else "")


def conclusion(report: CheckReport) -> list[tuple[str, str]]:
    """(status, words) pieces of the headline, the failing and warning checks named."""
    pieces = []
    for status in ("fail", "warn"):
        found = [c for c in report.checks if c.status == status]
        if found:
            pieces.append((status, f"{len(found)} {status}: {_names(found)}"))
    counts = report.counts
    if report.checks and not counts["fail"] and not counts["warn"] and not report.in_progress:
        pieces.append(("ok", "everything checked is fine"))
    for status in ("ok", "skip"):
        if counts[status]:
            pieces.append((status, f"{counts[status]} {status}"))
    return pieces


def headline(report: CheckReport) -> str:
    words = " · ".join(w for _, w in conclusion(report)) or "no checks yet"
    line = f"gpunb check · {words} · {seconds(report.duration_s)}"
    if report.quick:
        line += " · --quick"
    if report.deep:
        line += " · --deep"
    return line


def _wrap(label: str, text: str, width: int = 100) -> list[str]:
    prefix = f"    {label}" if label else "    "
    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=" " * len(prefix)) or [prefix]


def render_check_text(c: CheckResult) -> list[str]:
    lines = [f"{SYMBOL[c.status]} {c.status.upper():4} {c.title}"]
    lines += _wrap("", c.summary)
    if c.status in ("warn", "fail"):
        if c.cause:
            lines += _wrap("cause: ", c.cause)
        if c.fix:
            lines += _wrap("fix:   ", c.fix)
        if c.link:
            lines.append(f"    docs:  {c.link}")
    if c.tip:
        lines += _wrap("tip:   ", c.tip)
    return lines


def render_text(report: CheckReport) -> str:
    lines = [headline(report)]
    if report.in_progress:
        lines.append(f"… {report.in_progress}")
    for c in report.checks:
        lines += render_check_text(c)
    return "\n".join(lines)


def render_check_html(c: CheckResult) -> str:
    is_open = c.status in ("warn", "fail")
    # Closed rows show what was measured on the row itself; open ones below the title.
    inline = "" if is_open else f' <span style="{DIM}">— {code_html(c.summary)}</span>'
    body = [f'<div style="margin:2px 0 4px 22px;{DIM}">{code_html(c.summary)}</div>'] if is_open else []
    if c.status in ("warn", "fail"):
        for label, text in (("Cause", c.cause), ("Fix", c.fix)):
            if text:
                body.append(f'<div style="margin:2px 0 2px 22px"><b>{label}:</b> {code_html(text)}</div>')
    if c.tip:
        body.append(f'<div style="margin:2px 0 2px 22px"><b>Tip:</b> {code_html(c.tip)}</div>')
    if c.link:
        body.append(f'<div style="margin:2px 0 2px 22px"><a href="{escape(c.link, quote=True)}" target="_blank" '
                    f'rel="noopener noreferrer">documentation</a></div>')
    if not body:  # nothing more to expand
        return (f'<div style="margin:1px 0 1px 14px">{_badge(c)} {escape(c.title)}{inline}</div>')
    return (f'<details{" open" if is_open else ""} style="margin:1px 0"><summary style="cursor:pointer">'
            f'{_badge(c)} {escape(c.title)}{inline}</summary>' + "".join(body) + "</details>")


def _badge(c: CheckResult) -> str:
    color = COLOR[c.status]
    return (f'<span style="color:{color};font-weight:bold;display:inline-block;width:1.2em">{SYMBOL[c.status]}</span>'
            f'<span style="color:{color};font-weight:600">{escape(c.status)}</span>')


def render_html(report: CheckReport) -> str:
    pieces = " · ".join(f'<span style="color:{COLOR[s]};font-weight:600">{escape(w)}</span>'
                        if s in ("fail", "warn") else escape(w) for s, w in conclusion(report))
    head = (f'<div style="font-weight:600;margin-bottom:4px">gpunb check · {pieces or "no checks yet"} · '
            f'<span style="font-weight:normal;{DIM}">{escape(seconds(report.duration_s))}'
            f'{" · --quick" if report.quick else ""}{" · --deep" if report.deep else ""}</span></div>')
    progress = (f'<div style="margin-bottom:4px;{DIM}">running: {escape(report.in_progress)}…</div>'
                if report.in_progress else "")
    rows = "".join(render_check_html(c) for c in report.checks)
    return f'<div class="gpunb-check" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">' \
           f"{head}{progress}{rows}</div>"


# How the records show (gpunb.display looks these up; the records never import a view).
register_views(CheckResult, {"text/plain": lambda c: "\n".join(render_check_text(c)), "text/html": render_check_html})
register_views(CheckReport, {"text/plain": render_text, "text/html": render_html})
