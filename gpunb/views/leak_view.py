"""The leak finder's line in a cell's profile: the finding first ("memory grows 0.5 MiB per step:
`running_preds` holds 60 tensors with autograd history — append `logits.detach()`, or
`logits.item()` for a number"), its
evidence one click away. Pure functions of :class:`~gpunb.analysis.leaks.records.LeakReport`."""

from __future__ import annotations

from html import escape

from gpunb.analysis.leaks.records import LeakFinding, LeakReport
from gpunb.units import gib, seconds
from gpunb.views.chart import RED
from gpunb.views.markup import DIM, code_html


def _rate(report: LeakReport) -> str:
    rate = report.rate_per_step
    return f"memory grows {gib(rate)} per step" if rate >= 1 else "memory grows every step"


def _finding_words(f: LeakFinding) -> str:
    return f"{f.sentence} — {f.fix}"


def leak_headline(report: LeakReport | None) -> str:
    """The one line (empty when nothing grew): the rate, the first holder and its fix."""
    if report is None or not report.findings:
        return ""
    first = report.findings[0]
    line = f"{_rate(report)}: {_finding_words(first)}"
    more = len(report.findings) - 1
    return line + (f"; {more} more holder{'s' if more > 1 else ''} in the details" if more else "")


def evidence(report: LeakReport) -> list[str]:
    """What the finding rests on, one sentence each."""
    steps = ", ".join(str(s) for s in report.steps)
    lines = [f"{report.looks} censuses of the notebook's variables after steps {steps}; they took "
             f"{seconds(report.cost_s)} = {100 * report.cost_share:.2f}% of the cell"
             + (f", {report.looks_skipped} left out to stay within their time budget" if report.looks_skipped else "")]
    if report.allocated_per_step is not None:
        lines.append(f"torch's allocated bytes at step ends rose {gib(report.allocated_per_step)} per step "
                     "after the warm-up")
    for f in report.findings:
        if f.pattern == "unnamed":
            continue
        held = f"{f.tensors:,} tensor{'s' if f.tensors != 1 else ''}, {gib(f.bytes_held)}" + \
            (f", +{f.tensors_per_step:.2g} tensor{'s' if f.tensors_per_step != 1 else ''} and "
             f"+{gib(f.bytes_per_step)} per step"
             if f.pattern != "graph" else f", a graph of {f.graph_nodes:,} nodes growing by "
             f"{f.graph_nodes_per_step:.0f} per step")
        lines.append(f"`{f.holder}`: {held}")
    for f in report.findings[1:]:
        lines.append(_finding_words(f))
    if report.note:
        lines.append(report.note)
    return lines


def leak_text(report: LeakReport | None) -> list[str]:
    """The text form: the line, then the evidence indented (a terminal has no click)."""
    head = leak_headline(report)
    if not head or report is None:
        return []
    return [f"  {'leak':<11} {head}"] + [f"  {'':<11} {line}" for line in evidence(report)]


def leak_html(report: LeakReport | None) -> str:
    head = leak_headline(report)
    if not head or report is None:
        return ""
    items = "".join(f"<li>{code_html(line)}</li>" for line in evidence(report))
    return (f"<div class='gpunb-leak' style='margin:2px 0 6px 0'><b style='color:{RED}'>leak</b> "
            f"{code_html(head)}<details style='margin:2px 0'><summary style='cursor:pointer;{DIM}'>"
            f"{escape('how it was found')}</summary><ul style='margin:2px 0'>{items}</ul></details></div>")
