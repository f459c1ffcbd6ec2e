"""The check report as plain text (terminals, logs) and as HTML (notebooks, nbconvert).

Written for a glance: the first line is the finding (the failing check's own words, or "no
NVIDIA GPU on this machine" said once), then the problems with why and the fix, then one
short line per check that passed, values every GPU shares said once; skipped checks and the
full per-GPU readings are one click away (``<details>``, which JupyterLab's sanitizer keeps).

Both forms come from the same records; every dynamic string in HTML is escaped, because GPU
process names, paths and error messages are not ours to trust.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from html import escape
from typing import Any

from gpunb.analysis.checks.records import CheckReport, CheckResult
from gpunb.analysis.machine import NO_GPU as MACHINE_NO_GPU
from gpunb.display import register_views
from gpunb.units import gib, seconds
from gpunb.views import chart
from gpunb.views.markup import DIM, code_html
from gpunb.views.per_gpu import fold, without_qualifiers

SYMBOL = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "–"}
# Readable on light and dark backgrounds alike (gpunb.views.chart's palette).
COLOR = {"ok": chart.GREEN, "warn": chart.ORANGE, "fail": chart.RED, "skip": chart.GREY}
NO_GPU = MACHINE_NO_GPU.sentence


# -- what each check found, in one short sentence ------------------------------------------

def no_gpu(report: CheckReport) -> bool:
    """The machine has no NVIDIA GPU (gpunb.analysis.machine's "no_gpu" state, which the driver
    check records): the headline's own state, skipped unless a GPU was required."""
    return report.machine_state == "no_gpu" and report["driver"].status == "skip"


def finding(c: CheckResult) -> str:
    """What the check found, short: per-GPU values folded, asides left for the details."""
    try:
        if c.id == "driver" and c.status != "fail" and c.measured.get("gpus"):
            return _driver_finding(c.measured)
        if c.id == "gpu_links" and c.status != "skip":
            # pairs said once when they match ("all 28 pairs: PCIe; peer access n/a"); an
            # unknown PCIe path ("?") is left to the details
            return fold(re.sub(r"PCIe, \? ", "PCIe ", c.summary), "pairs")
    except (TypeError, ValueError, AttributeError):  # a reading NVML garbled: the plain summary
        pass
    return fold(c.summary)


def _driver_finding(measured: Mapping[str, Any]) -> str:
    kinds: dict[str, int] = {}
    lost = []
    for g in measured["gpus"]:
        if g.get("lost"):
            lost.append(f"GPU{g.get('index')}")
        else:
            kind = f"{g.get('name')}, {gib(g.get('memory_total_bytes'))}"
            kinds[kind] = kinds.get(kind, 0) + 1
    gpus = ", ".join(f"{n} × {kind}" for kind, n in kinds.items())
    gpus += f"; {', '.join(lost)} lost" if lost else ""
    return f"driver {measured.get('driver_version')}, CUDA {measured.get('cuda_driver_version')} · {gpus}"


def _pairs(measured: Mapping[str, Any]) -> dict[tuple[int, int], str]:
    """(a, b) -> how the pair is joined, in a matrix cell's few letters (NV18, PCIe, NODE)."""
    pairs = {}
    for key, value in measured.items():
        a, b = (int(part[3:]) for part in str(key).split("-"))
        topology = str(value.get("topology") or "?")
        pairs[a, b] = f"NV{value['nvlinks']}" if value.get("nvlinks") else ("PCIe" if topology == "?" else topology)
    return pairs


def link_matrix(c: CheckResult) -> list[list[str]]:
    """The GPU links as a matrix like ``nvidia-smi topo -m``: header row, then one row per GPU."""
    try:
        pairs = _pairs(c.measured)
    except (TypeError, ValueError, AttributeError, KeyError):
        return []
    gpus = sorted({i for pair in pairs for i in pair})
    rows = [["", *(f"GPU{i}" for i in gpus)]]
    for a in gpus:
        rows.append([f"GPU{a}", *("·" if a == b else pairs.get((min(a, b), max(a, b)), "?") for b in gpus)])
    return rows


def _problems(report: CheckReport) -> list[CheckResult]:
    """Failures, then warnings; the driver's "no GPU" is the headline's own state instead."""
    hidden = "driver" if no_gpu(report) else None
    return [c for status in ("fail", "warn") for c in report.checks if c.status == status and c.id != hidden]


def headline(report: CheckReport) -> str:
    """The first line: the first problem's finding, the no-GPU state, or that all is fine."""
    problems = _problems(report)
    if problems:
        more = len(problems) - 1
        return finding(problems[0]) + (f" — and {more} more below" if more else "")
    if no_gpu(report):
        return NO_GPU
    if report.in_progress or not report.checks:
        return "checking…"
    return "everything checked is fine"


def tally(report: CheckReport) -> str:
    """The second line: counts, time and mode."""
    counts = report.summary_line()  # the record's own words, so the view and the API agree
    line = " · ".join(["gpunb check", *([counts] if counts else []), seconds(report.duration_s)])
    return line + (" · --quick" if report.quick else "") + (" · --deep" if report.deep else "")


def _rows(report: CheckReport) -> tuple[list[CheckResult], list[CheckResult], list[CheckResult]]:
    """(problems, passed, skipped) in the checklist's order within each."""
    problems = _problems(report)
    shown = {id(c) for c in problems}
    passed = [c for c in report.checks if c.status == "ok"]
    skipped = [c for c in report.checks if id(c) not in shown and c.status == "skip"]
    return problems, passed, skipped


# -- text ----------------------------------------------------------------------------------

def _wrap(label: str, text: str, width: int = 100) -> list[str]:
    prefix = f"    {label}" if label else "    "
    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=" " * len(prefix)) or [prefix]


def render_check_text(c: CheckResult) -> list[str]:
    """One check in full: the finding, why, the fix, the full reading."""
    lines = [f"{SYMBOL[c.status]} {finding(c)} — {c.title}"]
    if c.status in ("warn", "fail"):
        if c.cause:
            lines += _wrap("why:  ", c.cause)
        if c.fix:
            lines += _wrap("fix:  ", c.fix)
        if c.link:
            lines.append(f"    docs: {c.link}")
    if c.tip:
        lines += _wrap("tip:  ", c.tip)
    if without_qualifiers(c.summary) != finding(c) and c.id != "gpu_links":
        lines += _wrap("read: ", c.summary)
    return lines


def render_text(report: CheckReport) -> str:
    lines = [headline(report), tally(report)]
    if report.in_progress:
        lines.append(f"… {report.in_progress}")
    problems, passed, skipped = _rows(report)
    for c in problems:
        lines += render_check_text(c)
    for c in passed:
        # one line per check (a terminal wraps it; a wrapped finding would not read as one)
        lines.append(f"{SYMBOL['ok']} {without_qualifiers(c.title)} — {finding(c)}")
        matrix = link_matrix(c) if c.id == "gpu_links" else []
        if matrix and len({cell for row in matrix[1:] for cell in row[1:]} - {"·"}) > 1:
            lines += ["    " + " ".join(f"{cell:>5}" for cell in row) for row in matrix]
    if skipped:
        names = "; ".join(without_qualifiers(c.title) for c in skipped)
        lines += textwrap.wrap(f"{SYMBOL['skip']} {len(skipped)} skipped: {names}", 100, subsequent_indent="    ")
    return "\n".join(lines)


# -- HTML ----------------------------------------------------------------------------------

_INDENT = "margin:2px 0 2px 22px"


def _badge(status: str) -> str:
    return f'<span style="color:{COLOR[status]};font-weight:bold;display:inline-block;width:1.2em">' \
           f"{SYMBOL[status]}</span>"


def _matrix_html(c: CheckResult) -> str:
    matrix = link_matrix(c)
    if not matrix:
        return ""
    cell = "padding:0 6px;text-align:center"
    head = "".join(f'<th style="{cell}">{escape(h)}</th>' for h in matrix[0])
    body = "".join("<tr>" + f'<th style="{cell}">{escape(row[0])}</th>'
                   + "".join(f'<td style="{cell}">{escape(v)}</td>' for v in row[1:]) + "</tr>"
                   for row in matrix[1:])
    return (f'<table style="{_INDENT};border-collapse:collapse;font-size:12px;font-family:var(--jp-code-font-family,'
            f'monospace)"><tr>{head}</tr>{body}</table>')


def _more(c: CheckResult) -> list[str]:
    """What a click on the row shows: the full reading, the link matrix, a tip, the docs."""
    body = []
    if c.id == "gpu_links" and c.status != "skip":
        body.append(_matrix_html(c))
    if without_qualifiers(c.summary) != finding(c) or "(" in c.summary:
        body.append(f'<div style="{_INDENT};{DIM}">{code_html(c.summary)}</div>')
    if c.tip:
        body.append(f'<div style="{_INDENT}"><b>Tip:</b> {code_html(c.tip)}</div>')
    if c.link:
        body.append(f'<div style="{_INDENT}"><a href="{escape(c.link, quote=True)}" target="_blank" '
                    f'rel="noopener noreferrer">documentation</a></div>')
    return [b for b in body if b]


def render_check_html(c: CheckResult) -> str:
    """One row: a problem opened with why and the fix; anything else one closed line."""
    if c.status in ("warn", "fail"):
        summary = (f'{_badge(c.status)}<b>{code_html(finding(c))}</b> '
                   f'<span style="{DIM}">· {escape(c.title)}</span>')
        why = [f'<div style="{_INDENT}"><b>{label}:</b> {code_html(text)}</div>'
               for label, text in (("Why", c.cause), ("Fix", c.fix)) if text]
        return (f'<details open style="margin:2px 0"><summary style="cursor:pointer">{summary}</summary>'
                + "".join(why + _more(c)) + "</details>")
    line = (f'{_badge(c.status)}{escape(without_qualifiers(c.title))} '
            f'<span style="{DIM}">— {code_html(finding(c))}</span>')
    more = _more(c)
    if not more:
        return f'<div style="margin:1px 0 1px 14px">{line}</div>'
    return f'<details style="margin:1px 0"><summary style="cursor:pointer">{line}</summary>{"".join(more)}</details>'


def render_html(report: CheckReport) -> str:
    problems, passed, skipped = _rows(report)
    status = problems[0].status if problems else ("skip" if no_gpu(report) else "ok")
    color = f"color:{COLOR[status]};" if status in ("fail", "warn") else ""
    head = (f'<div style="font-weight:600;font-size:14px;{color}">{escape(headline(report))}</div>'
            f'<div style="margin-bottom:4px;{DIM}">{escape(tally(report))}</div>')
    progress = (f'<div style="margin-bottom:4px;{DIM}">{escape(report.in_progress)}…</div>'
                if report.in_progress else "")
    problems_html = "".join(render_check_html(c) for c in problems)
    rows = "".join(render_check_html(c) for c in passed)
    if skipped:
        inner = "".join(f'<div style="{_INDENT}">{escape(c.title)} <span style="{DIM}">— '
                        f'{code_html(without_qualifiers(c.summary))}</span></div>' for c in skipped)
        rows += (f'<details style="margin:1px 0"><summary style="cursor:pointer">{_badge("skip")}'
                 f'{len(skipped)} checks skipped <span style="{DIM}">— why</span></summary>{inner}</details>')
    return ('<div class="gpunb-check" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;'
            f'overflow-wrap:anywhere">{head}{progress}{problems_html}{rows}</div>')


# How the records show (gpunb.display looks these up; the records never import a view).
register_views(CheckResult, {"text/plain": lambda c: "\n".join(render_check_text(c)), "text/html": render_check_html})
register_views(CheckReport, {"text/plain": render_text, "text/html": render_html})
