"""``%gpufit``'s progress while it searches (:class:`~gpunb.shells.live_progress.LiveProgress`):
the trial running now ("trial 2 of at most 6: batch 512 (candidate)…"), the seconds ticking,
a bar over the trials, and the fitted batch in its place at the end."""

from __future__ import annotations

import re
from typing import Any

from gpunb.shells.live_progress import TICK_S, LiveProgress

TITLE = "Finding the largest batch that fits"
_TRIAL = re.compile(r"^trial (\d+):")


class FitProgress(LiveProgress):
    """The ``progress`` callable of ``fit_batch_size`` (each line of the search)."""

    def __init__(self, shell: Any, *, max_trials: int, steps: int, tick_s: float = TICK_S) -> None:
        self.trial: int | None = None  # the trial the last line was about
        super().__init__(shell, title=TITLE, name="gpufit", step_name="trial", at_most=True,
                         step_of=lambda _doing: (self.trial, max_trials) if self.trial else (None, None),
                         note=f"Each trial trains {steps} steps at one batch size; the result appears here.",
                         tick_s=tick_s)

    def __call__(self, line: str) -> None:
        match = _TRIAL.match(line)
        if match:
            self.trial = int(match.group(1))
            line = line[match.end():].strip()
        self.say(line)
