"""Fault injection at every line of gpunb's code a magic runs on the kernel thread.

Each magic is run once in an in-process IPython shell with a :class:`LineInjector` listing the
points (every line of gpunb's code executed on the main thread, each loop's first two passes);
then once per point, with a ``KeyboardInterrupt`` (a Ctrl-C) or an ``asyncio.CancelledError``
(a ``BaseException`` that is not a Ctrl-C) raised there. After each injection the invariants:
no transaction of gpunb's left open (hooks, torch's allocation history, environment entries,
processes), torch's allocation history back as it was, no child process left, and the next cell
traces normally. ``GPUNB_FAULT_EVERY=N`` injects at every N-th point: 4 by default (CI time),
``GPUNB_FAULT_EVERY=1`` at every line.

Covered here: ``%%gpumem --trace`` (torch's history replayed from an H200 recording) and
``%gpumem --trace on/off`` with ``%unload_ext``. The profile's start and stop have their own
every-line test (``test_fault_transactions.py``); the probe's, ``test_child_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from gpunb.readings.children import live_children
from gpunb.readings.transaction import open_transactions
from tests.line_injector import LineInjector
from tests.simulated_alloc_history import recorded_torch

EVERY = max(1, int(os.environ.get("GPUNB_FAULT_EVERY", "4")))  # CI: every 4th point; 1: every line
TRACED_CELL = "%%gpumem --trace\nx = 1\n"


@pytest.fixture
def traced(ip, monkeypatch):
    import gpunb.readings.torch_state as torch_state

    sim = recorded_torch()
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    handler = signal.getsignal(signal.SIGINT)
    ip.run_cell(TRACED_CELL)  # warm: first-time imports are not a cell's state
    yield ip, sim
    signal.signal(signal.SIGINT, handler)


def _points(ip, cell: str) -> list[tuple[str, int, int]]:
    recorder = LineInjector()
    with recorder:
        ip.run_cell(cell)
    return recorder.points


def _check_clean(ip, sim, where: str) -> list[str]:
    problems = []
    if sim.cuda.enabled:
        problems.append(f"{where}: torch's allocation history left on")
        sim.cuda.enabled = False
    left = [t for t in open_transactions() if t.name != "gpunb extension"]  # that one is open while loaded
    if left:
        problems.append(f"{where}: open transactions {left}")
    if live_children():
        problems.append(f"{where}: child processes left {live_children()}")
    return problems


@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError])
def test_traced_cell_every_line(traced, exc):
    ip, sim = traced
    every_point = _points(ip, TRACED_CELL)
    points = every_point[::EVERY]
    assert len(every_point) > 40, f"only {len(points)} lines of gpunb ran: the tracer did not see the magic"
    problems, fired = [], 0
    for point in points:
        injector = LineInjector(at=point, raise_=exc)
        with injector, contextlib.suppress(exc):  # IPython passes one raised in a cell hook on: fine
            ip.run_cell(TRACED_CELL)
        fired += injector.fired
        problems += _check_clean(ip, sim, injector.where or str(point))
    print(f"%%gpumem --trace: {len(every_point)} points, {len(points)} injected, {fired} fired, "
          f"{len(problems)} failures ({exc.__name__})")
    assert fired > len(points) * 0.9
    assert not problems, "\n".join(problems[:20])
    # the next cell traces normally
    ip.run_cell("%%gpumem --trace -o t\ny = 2\n")
    assert not ip.user_ns["t"].unavailable and not sim.cuda.enabled


@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError])
def test_armed_history_on_off_and_unload_every_line(traced, exc):
    ip, sim = traced
    sequences = ["%gpumem --trace on", "%gpumem --trace off", "%unload_ext gpunb"]
    total = failures = 0
    for magic in sequences:
        ip.run_line_magic("gpumem", "--trace on") if magic != "%gpumem --trace on" else None
        every_point = _points(ip, magic)
        points = every_point[::EVERY]
        print(f"{magic}: {len(every_point)} points, {len(points)} injected ({exc.__name__})")
        if magic == "%unload_ext gpunb":
            ip.run_line_magic("load_ext", "gpunb")
        for point in points:
            if magic != "%gpumem --trace on":
                ip.run_line_magic("gpumem", "--trace on")
            with LineInjector(at=point, raise_=exc), contextlib.suppress(exc):
                ip.run_cell(magic)
            if magic == "%unload_ext gpunb":
                ip.run_line_magic("unload_ext", "gpunb")  # a second unload finishes a cut-off one
                ip.run_line_magic("load_ext", "gpunb")
            else:  # off, then the invariants: `%gpumem --trace off` switches off what a Ctrl-C left on
                ip.run_line_magic("gpumem", "--trace off")
            total += 1
            found = _check_clean(ip, sim, f"{magic} at {point}")
            failures += len(found)
            assert not found, found
    print(f"%gpumem --trace on/off, %unload_ext: {total} injection points, {failures} failures ({exc.__name__})")
