"""``%gpucheck``'s progress while it runs: one output redrawn in place, then the report.

What it shows is progress (what runs now, the seconds so far, step k of n of the CUDA probe),
never a partial report: a tally of the checks done so far ("17 ok") read as a verdict before
a failure that was still to come. The elapsed time ticks on its own (a small thread redraws
the line twice a second: a display update by id, which a Jupyter frontend routes to this
output whatever runs meanwhile) because the checklist reports only when a step starts or
ends, and importing torch alone takes seconds. Outside a Jupyter kernel the steps go to
stderr, one line each.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from gpunb.analysis.checks.checklist import STEP_WORDS
from gpunb.analysis.checks.records import CheckReport
from gpunb.views.progress_view import Progress, progress_html, progress_text

TICK_S = 0.5  # how often the elapsed time is redrawn
TITLE = "Checking the setup"
NOTE = "The checklist appears here when every check has run."
_PROBE_STEPS = tuple(STEP_WORDS.values())


def _plain(message: str) -> str:
    """The step in words, without a "running:" the checklist or a caller may have put first."""
    while message.startswith("running: "):
        message = message[len("running: "):]
    return message


def _step_of(doing: str) -> int | None:
    """Which step of the CUDA probe ``doing`` names (1-based), None for anything else."""
    for i, words in enumerate(_PROBE_STEPS):
        if doing.startswith(words):
            return i + 1
    return None


class CheckProgress:
    """The progress callback of ``check()`` (called on the kernel's thread with each partial
    report), and the output that the final report replaces."""

    def __init__(self, shell: Any, *, tick_s: float = TICK_S) -> None:
        self._in_kernel = getattr(shell, "kernel", None) is not None
        self._tick_s = tick_s
        self._t0 = time.monotonic()
        self._lock = threading.Lock()  # the kernel's thread and the ticker draw one output
        self._handle: Any = None
        self._doing = ""
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.frames = 0  # redraws sent (tests)

    def progress(self) -> Progress:
        step = _step_of(self._doing)
        return Progress(TITLE, time.monotonic() - self._t0, self._doing, step,
                        len(_PROBE_STEPS) if step is not None else None, NOTE)

    def _bundle(self) -> dict[str, str]:
        p = self.progress()
        return {"text/plain": progress_text(p), "text/html": progress_html(p)}

    def update(self, partial: CheckReport) -> None:
        doing = _plain(partial.in_progress or "")
        if not self._in_kernel:
            if doing and doing != self._doing:
                print(f"gpucheck: {doing}", file=sys.stderr, flush=True)
            self._doing = doing
            return
        from IPython.display import display

        with self._lock:
            self._doing = doing or self._doing
            if self._handle is None:
                self._handle = display(self._bundle(), raw=True, display_id=True)
                self._start_ticker()
            elif not self._stop.is_set():
                self._handle.update(self._bundle(), raw=True)
            self.frames += 1

    def _start_ticker(self) -> None:
        self._ticker = threading.Thread(target=self._tick, name="gpunb-check-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            with self._lock:
                if self._stop.is_set() or self._handle is None:
                    return
                try:
                    self._handle.update(self._bundle(), raw=True)
                    self.frames += 1
                except Exception:  # the kernel is shutting down: nothing left to draw on
                    return

    def _end(self) -> None:
        self._stop.set()
        ticker = self._ticker
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join(2 * self._tick_s + 1.0)

    def clear(self) -> None:
        """The check did not run (a bad option): remove the progress line."""
        self._end()
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)

    def interrupted(self) -> None:
        """The check was stopped (Ctrl-C, the kernel's interrupt): say so where the progress was."""
        self._end()
        if self._handle is not None:
            seconds = time.monotonic() - self._t0
            self._handle.update({"text/plain": f"gpucheck: interrupted after {seconds:.1f} s; no report."}, raw=True)

    def finish(self, report: CheckReport) -> None:
        """Replace the progress with the report (or show it, when no progress was drawn)."""
        self._end()
        from IPython.display import display

        if self._handle is not None:
            self._handle.update(report)
        else:
            display(report)
