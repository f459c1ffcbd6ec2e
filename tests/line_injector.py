"""A trace function that interrupts gpunb's code at a chosen line: fault injection at every line.

Run a piece of gpunb once with ``LineInjector()`` to list the points (each line of gpunb's code
it executes, each loop's first two passes); then once per point with ``LineInjector(at=point)``,
which raises ``KeyboardInterrupt`` (or ``raise_``, e.g. ``asyncio.CancelledError``) there, the
way a SIGINT lands between two statements. ``sys.settrace`` traces only the thread that set it
(and threads started after, through ``threading.settrace``, which this does not set): the
kernel thread's lines, where a Ctrl-C lands.
"""

from __future__ import annotations

import linecache
import sys
import threading
from pathlib import Path

import gpunb

GPUNB_DIR = str(Path(gpunb.__file__).parent)


class LineInjector:
    """A trace function raising KeyboardInterrupt when gpunb's code reaches line ``at`` (a
    ``(file, line, n)``: the n-th time that line runs; None: only records the lines). Raising
    from a trace function switches tracing off, so one run gets one interrupt.

    Every line is a point, each loop's first two passes (a third pass is no new state). Not
    the first line of the method called (``try:`` of ``start``/``stop``: an interrupt there is
    the caller's to handle, as the magic does), nor the line event of a ``with`` statement's
    end: an exception there leaves the context manager unexited in CPython itself (a lock
    stays held; bpo-29988), which is one reason gpunb holds SIGINT back around its start and
    stop instead."""

    def __init__(self, at: tuple[str, int, int] | None = None, *,
                 raise_: type[BaseException] = KeyboardInterrupt, main_thread_only: bool = True) -> None:
        self.at = at
        self.raise_ = raise_
        self.main_thread_only = main_thread_only  # the kernel thread's lines, not a helper thread's
        self.points: list[tuple[str, int, int]] = []
        self._seen: dict[tuple[str, int], int] = {}
        self._entered: set[tuple[int, int]] = set()  # (frame id, line) of with statements entered
        self.where = ""
        self._entry = None

    def __enter__(self) -> LineInjector:
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)

    @property
    def fired(self) -> bool:
        return bool(self.where)

    def _global(self, frame, event, arg):
        if self.main_thread_only and threading.current_thread() is not threading.main_thread():
            return None
        return self._local if frame.f_code.co_filename.startswith(GPUNB_DIR) else None

    def _local(self, frame, event, arg):
        if event != "line":
            return self._local
        if self._entry is None:
            self._entry = frame  # the method the test called
        file, line = frame.f_code.co_filename, frame.f_lineno
        if frame is self._entry and line == frame.f_code.co_firstlineno + _body_offset(frame.f_code):
            return self._local
        if linecache.getline(file, line).lstrip().startswith(("with ", "async with ")):
            key = (id(frame), line)
            if key in self._entered:
                return self._local  # the with block's exit
            self._entered.add(key)
        n = self._seen[(file, line)] = self._seen.get((file, line), 0) + 1
        if n > 2:
            return self._local
        point = (file, line, n)
        if self.at is None:
            self.points.append(point)
        elif point == self.at:
            self.where = f"{Path(file).name}:{line} (pass {n})"
            raise self.raise_(f"injected at {self.where}")
        return self._local


def _body_offset(code) -> int:
    """Lines from ``def`` to the first statement of the body (past the docstring)."""
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return (lines[1] if len(lines) > 1 else lines[0]) - code.co_firstlineno
