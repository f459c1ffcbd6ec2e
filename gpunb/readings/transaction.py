"""Put process state in and take it out again as one transaction: nothing left by a Ctrl-C.

gpunb switches things in the user's process on and off: hooks and wrapped methods, torch's
allocation history, environment variables, child processes, widget comms. Each such switch
is a pair (do, undo), and the class of failure is the same for all of them: an exception
(a Ctrl-C is a ``KeyboardInterrupt``; a cancelled task is ``asyncio.CancelledError``) landing
between the "do" and the moment the "undo" is remembered leaves the state switched on for the
rest of the kernel. A :class:`Transaction` closes that window:

- :meth:`Transaction.switch` registers the undo *before* it runs the do, both with SIGINT held
  back (:func:`~gpunb.readings.interrupts.deferred_sigint`), so an undo is known for
  everything that may have happened; an undo must therefore be safe to run when its do did
  not finish (idempotent, "put back as it was").
- :meth:`Transaction.close` runs the undos newest first, each once, all of them even when one
  fails; an undo interrupted by a ``BaseException`` runs once more and that exception is
  raised at the end (the user's Ctrl-C still reaches the cell).
- Every open transaction is known to :func:`close_all`, which ``%unload_ext`` calls: a
  transaction a Ctrl-C cut off before its owner could close it is closed there at the latest.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gpunb.readings.interrupts import deferred_sigint

T = TypeVar("T")

_OPEN: weakref.WeakSet[Transaction] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


class Transaction:
    """An undo stack for state gpunb puts into the process; ``name`` says whose (for tests)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.undos: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<Transaction {self.name!r}: {len(self.undos)} to undo>"

    @property
    def open(self) -> bool:
        return bool(self.undos)

    def add(self, undo: Callable[[], None]) -> None:
        """Remember ``undo`` (for a switch whose do the caller makes itself, after this)."""
        self.undos.append(undo)
        with _OPEN_LOCK:
            _OPEN.add(self)

    def switch(self, do: Callable[[], T], undo: Callable[[], None]) -> T:
        """Run ``do`` with its ``undo`` registered first, SIGINT held back for both. An exception
        from ``do`` leaves the undo registered: :meth:`close` puts back whatever ``do`` did."""
        with deferred_sigint():
            self.add(undo)
            return do()

    def close(self) -> None:
        """Run every undo, newest first (idempotent). An undo is dropped only once it ran: one
        interrupted by a ``BaseException`` runs once more, the others still run, and that
        exception is raised at the end; an ``Exception`` of an undo is dropped (the others must
        still run)."""
        interrupted: BaseException | None = None
        with deferred_sigint():
            while self.undos:
                undo = self.undos[-1]
                try:
                    undo()
                except Exception:  # noqa: BLE001 (putting back must go on for the others)
                    pass
                except BaseException as exc:  # noqa: BLE001 (raised again below, once all ran)
                    interrupted = interrupted or exc
                    try:
                        undo()
                    except BaseException:  # noqa: BLE001 (the rest must still run)
                        pass
                self.undos.pop()
            with _OPEN_LOCK:
                _OPEN.discard(self)
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextmanager
def switched(do: Callable[[], Any], undo: Callable[[], None], name: str = "") -> Iterator[Any]:
    """``with switched(on, off):`` the state is on inside the block and off after it, whatever
    ends the block."""
    transaction = Transaction(name)
    try:
        yield transaction.switch(do, undo)
    finally:
        transaction.close()


def open_transactions() -> list[Transaction]:
    """The transactions with something still to undo (tests assert this is empty)."""
    with _OPEN_LOCK:
        return [t for t in _OPEN if t.open]


def close_all() -> None:
    """Close every open transaction (``%unload_ext``): each is closed even when another raises;
    the first ``BaseException`` is raised at the end."""
    interrupted: BaseException | None = None
    for transaction in open_transactions():
        try:
            transaction.close()
        except BaseException as exc:  # noqa: BLE001 (the others must close too)
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
