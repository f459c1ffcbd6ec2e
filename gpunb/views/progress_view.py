"""A long-running magic's progress while it runs: what it is doing now, for how long, and
which step of how many. Pure functions of a :class:`Progress`; the shells redraw it in place
(``gpunb.shells.progress``) and replace it with the report when the work ends.

Progress, not a tally: nothing here counts results, because a count of passed checks shown
before a failure that is still to come reads as "all fine" (the first version showed
"17 ok" while the CUDA probe was still running).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from gpunb.views.chart import BLUE, NEUTRAL
from gpunb.views.markup import DIM


@dataclass(frozen=True)
class Progress:
    title: str  # "Checking the setup"
    elapsed_s: float
    doing: str = ""  # "importing torch in a subprocess"
    step: int | None = None  # 1-based, with ``steps``: "step 2 of 6"
    steps: int | None = None
    note: str = ""  # what to expect: "the checklist appears here when every check has run"
    step_name: str = "step"  # "trial": "trial 2 of at most 6"
    at_most: bool = False  # ``steps`` is a cap (the search may end sooner), not a count

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.steps:
            return None
        return min(1.0, max(0.0, (self.step - 1) / self.steps))


def _step_words(p: Progress) -> str:
    if p.step is None or not p.steps:
        return ""
    return f"{p.step_name} {p.step} of {'at most ' if p.at_most else ''}{p.steps}"


def progress_text(p: Progress) -> str:
    """'Checking the setup · 4.2 s · step 2 of 6: starting CUDA in a subprocess'."""
    now = ": ".join(x for x in (_step_words(p), p.doing) if x)
    return " · ".join(x for x in (f"{p.title}…", f"{p.elapsed_s:.1f} s", now) if x)


def progress_html(p: Progress) -> str:
    """The same as a line, a bar (when the step count is known) and the note, dimmed."""
    now = ": ".join(x for x in (_step_words(p), p.doing) if x)
    bar = ""
    if p.fraction is not None:
        width = 220
        filled = round(width * p.fraction)
        bar = (f'<div role="progressbar" aria-valuemin="0" aria-valuemax="{p.steps}" aria-valuenow="{p.step}" '
               f'style="width:{width}px;height:6px;border:1px solid {NEUTRAL};border-radius:3px;margin:3px 0">'
               f'<div style="width:{filled}px;height:6px;background-color:{BLUE};border-radius:2px"></div></div>')
    note = f'<div style="{DIM};font-size:11px">{escape(p.note)}</div>' if p.note else ""
    return (f'<div class="gpunb-progress" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:12px">'
            f'<b>{escape(p.title)}…</b> <span class="gpunb-elapsed">{p.elapsed_s:.1f} s</span>'
            f'{" · " + escape(now) if now else ""}{bar}{note}</div>')
