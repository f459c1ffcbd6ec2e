"""``%gpucheck``'s progress while it runs (:class:`~gpunb.shells.live_progress.LiveProgress`):
the step in words and, for the CUDA probe, step k of 6; never a tally of the checks so far."""

from __future__ import annotations

from typing import Any

from gpunb.analysis.checks.checklist import STEP_WORDS
from gpunb.analysis.checks.records import CheckReport
from gpunb.shells.live_progress import TICK_S, LiveProgress

TITLE = "Checking the setup"
NOTE = "The checklist appears here when every check has run."
_PROBE_STEPS = tuple(STEP_WORDS.values())


def _plain(message: str) -> str:
    """The step in words, without a "running:" the checklist or a caller may have put first."""
    while message.startswith("running: "):
        message = message[len("running: "):]
    return message


def _step_of(doing: str) -> tuple[int | None, int | None]:
    """Which step of the CUDA probe ``doing`` names (1-based, of 6); (None, None) for anything else."""
    for i, words in enumerate(_PROBE_STEPS):
        if doing.startswith(words):
            return i + 1, len(_PROBE_STEPS)
    return None, None


class CheckProgress(LiveProgress):
    """The progress callback of ``check()`` (called with each partial report)."""

    def __init__(self, shell: Any, *, tick_s: float = TICK_S) -> None:
        super().__init__(shell, title=TITLE, note=NOTE, name="gpucheck", step_of=_step_of, tick_s=tick_s)

    def update(self, partial: CheckReport) -> None:
        self.say(_plain(partial.in_progress or ""))
