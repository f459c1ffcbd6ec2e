"""A long magic's progress while it runs (``%gpucheck``, ``%gpufit``): one output redrawn in
place, then the report in its place.

What it shows is progress (what runs now, the seconds so far, step k of n), never a partial
result: a tally of the checks done so far ("17 ok") read as a verdict before a failure that
was still to come. The elapsed time ticks on its own (a small thread redraws the line twice a
second: a display update by id, which a Jupyter frontend routes to this output whatever runs
meanwhile) because the work reports only when a step starts or ends, and importing torch alone
takes seconds. Outside a Jupyter kernel each new step is one line on stderr.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpunb.views.progress_view import Progress, progress_html, progress_text

TICK_S = 0.5  # how often the elapsed time is redrawn


class LiveProgress:
    """``say(doing)`` with each step (on the kernel's thread); ``finish(report)`` puts the
    report in the progress line's place; ``interrupted()`` says it stopped."""

    def __init__(self, shell: Any, *, title: str, note: str, name: str,
                 step_of: Callable[[str], tuple[int | None, int | None]] = lambda doing: (None, None),
                 step_name: str = "step", at_most: bool = False, tick_s: float = TICK_S) -> None:
        self._in_kernel = getattr(shell, "kernel", None) is not None
        self.title, self.note, self.name = title, note, name
        self._step_of = step_of
        self._step_name, self._at_most = step_name, at_most
        self._tick_s = tick_s
        self._t0 = time.monotonic()
        self._lock = threading.Lock()  # the kernel's thread and the ticker draw one output
        self._handle: Any = None
        self._doing = ""
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.frames = 0  # redraws sent (tests)

    def progress(self) -> Progress:
        step, steps = self._step_of(self._doing)
        return Progress(self.title, time.monotonic() - self._t0, self._doing, step, steps, self.note,
                        self._step_name, self._at_most)

    def _bundle(self) -> dict[str, str]:
        p = self.progress()
        return {"text/plain": progress_text(p), "text/html": progress_html(p)}

    def say(self, doing: str) -> None:
        if not self._in_kernel:
            if doing and doing != self._doing:
                print(f"{self.name}: {doing}", file=sys.stderr, flush=True)
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
        self._ticker = threading.Thread(target=self._tick, name="gpunb-progress", daemon=True)
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
        """The work did not run (a bad option): remove the progress line."""
        self._end()
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)

    def interrupted(self, cancelled: bool = False) -> None:
        """The work was stopped (Cancel, Ctrl-C, the kernel's interrupt): say so where the progress was."""
        self._end()
        seconds = time.monotonic() - self._t0
        words = "cancelled" if cancelled else "interrupted"
        line = f"{self.name}: {words} after {seconds:.1f} s; no report. Run %{self.name} again for one."
        if self._handle is not None:
            self._handle.update({"text/plain": line}, raw=True)
        elif cancelled:
            print(line)

    def finish(self, report: Any) -> None:
        """Replace the progress with the report (or show it, when no progress was drawn)."""
        self._end()
        from IPython.display import display

        if self._handle is not None:
            self._handle.update(report)
        else:
            display(report)
