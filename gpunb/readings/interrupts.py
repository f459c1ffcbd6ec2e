"""Hold a Ctrl-C back while gpunb puts the process state in or takes it out again.

A Ctrl-C in a kernel is a SIGINT; Python turns it into ``KeyboardInterrupt`` between any two
bytecodes of the main thread. Landing between "wrap ``Tensor.item``" and "remember to unwrap
it", it left hooks installed for good (issue 22). :func:`deferred_sigint` swaps in a handler that
only notes the signal, and on leaving the block raises a noted signal again for the handler that
was there before (the default one: ``KeyboardInterrupt`` right after the block), so the
block runs to its end and the interrupt still happens.

Only the main thread can set signal handlers; elsewhere (and where the handler cannot be
read or set) the block runs undeferred. The blocks are meant to be short: installing or
removing hooks, restoring a model's saved state.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def deferred_sigint() -> Iterator[None]:
    """Run the block with SIGINT held back; a SIGINT that came is delivered at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[tuple[int, Any]] = []

    def note(signum: int, frame: Any) -> None:
        noted.append((signum, frame))

    try:
        previous = signal.signal(signal.SIGINT, note)
    except (ValueError, OSError, TypeError):  # no signals here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        try:
            signal.signal(signal.SIGINT, previous)
        except (ValueError, OSError, TypeError):
            pass
        if noted:  # once, as the handler in place would have had it (Python's: KeyboardInterrupt)
            signal.raise_signal(signal.SIGINT)
