"""A process gpunb starts, ended with whatever started it: its whole process group, killed.

The CUDA probe, the all-reduce ranks: each runs in a session of its own (``start_new_session``,
so it is the leader of its own process group and a kill reaches what it started in turn, a
torch compile worker, a NCCL helper). :meth:`Child.end` kills the group and reaps the
leader; it is idempotent and may come before :meth:`Child.start` (a Ctrl-C that closed the
owner's transaction while another thread was about to start the child): then the start is
refused. Every live child is also ended at interpreter exit (kernel shutdown, restart).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import weakref
from typing import Any

_LIVE: weakref.WeakSet[Child] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class ChildCancelled(OSError):
    """The child was ended before it started (its owner closed first)."""


class Child:
    """One child process and its process group."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: subprocess.Popen[Any] | None = None
        self.ended = False
        self._group_killed = False
        self.cancelled = False  # ended by its owner (a Ctrl-C, Cancel) rather than by its own end
        self._lock = threading.Lock()

    def start(self, cmd: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(cmd, **popen)`` in a session of its own; refused (``ChildCancelled``)
        once :meth:`end` ran."""
        with self._lock:
            if self.ended:
                raise ChildCancelled(f"{self.name} was cancelled before it started")
            self.proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self.proc

    def cancel(self) -> None:
        """End it because its owner stopped (a Ctrl-C, the Cancel button, an error)."""
        self.cancelled = True
        self.end()

    def end(self, wait_s: float = 5.0) -> None:
        """Kill the process group (what is still running of it) and reap the leader."""
        with self._lock:
            self.ended = True
            proc = self.proc
            first = proc is not None and not self._group_killed
        if proc is None:
            return
        if first:
            # the group, even when its leader has exited: what it started (a worker holding the
            # pipe) lives on in it. Its id is not reused while a member of the group lives.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:  # ProcessLookupError: the group is gone already
                pass
            self._group_killed = True  # only now: an end() cut off before the kill kills again
        if proc.returncode is None:
            try:
                proc.kill()
            except OSError:
                pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # unkillable (a process in the driver, D state): leave it
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)


def live_children() -> list[Child]:
    """Children started and not ended (tests assert this is empty after a cell)."""
    with _LIVE_LOCK:
        return [c for c in _LIVE if not c.ended]


@atexit.register
def _end_all() -> None:
    for child in live_children():
        try:
            child.end(wait_s=1.0)
        except Exception:  # noqa: BLE001 (exiting: the others must end too)
            pass
