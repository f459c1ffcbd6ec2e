"""%gpucheck while it runs: progress (what runs, seconds ticking, step k of n), never a
premature tally, and the report in the progress line's place at the end."""

from __future__ import annotations

import threading
import time

import IPython.display
import pytest

from gpunb.analysis.checks.records import CheckReport
from gpunb.shells.check_progress import CheckProgress
from gpunb.views.progress_view import Progress, progress_html, progress_text
from tests.test_checks import h200_torch, run  # noqa: F401  (h200_torch is a fixture)


class FakeHandle:
    """What ``display(..., display_id=True)`` returns, recording every frame."""

    def __init__(self, frames: list) -> None:
        self.frames = frames
        self.lock = threading.Lock()

    def update(self, obj, raw=False):
        with self.lock:
            self.frames.append(obj)


class KernelShell:
    kernel = object()  # a Jupyter kernel: outputs can be redrawn in place


def _capture(monkeypatch) -> list:
    frames: list = []

    def display(obj, raw=False, display_id=False, **kw):
        frames.append(obj)
        return FakeHandle(frames)

    monkeypatch.setattr(IPython.display, "display", display)
    return frames


def _texts(frames: list) -> list[str]:
    return [f["text/plain"] for f in frames if isinstance(f, dict)]


def test_progress_shows_steps_not_a_tally_and_the_report_replaces_it(h200_torch, monkeypatch):  # noqa: F811
    frames = _capture(monkeypatch)
    shown = CheckProgress(KernelShell(), tick_s=60)
    report = run(progress=shown.update)
    texts = _texts(frames)
    assert texts and all(t.startswith("Checking the setup…") for t in texts)
    assert not any(" ok" in t or "fail" in t for t in texts)  # no "17 ok" before the verdict
    assert not any("running: running" in t or "running:" in t for t in texts)
    assert any("step 1 of 6: importing torch in a subprocess" in t for t in texts)
    assert any("step 4 of 6: training-step smoke test on cuda:0" in t for t in texts)
    assert all("role=\"progressbar\"" in f["text/html"] or "step" not in f["text/plain"]
               for f in frames if isinstance(f, dict))
    shown.finish(report)
    assert frames[-1] is report  # the report takes the progress line's place


def test_the_elapsed_time_ticks_while_a_step_takes_long(monkeypatch):
    frames = _capture(monkeypatch)
    shown = CheckProgress(KernelShell(), tick_s=0.05)
    shown.update(CheckReport((), 0.0, False, None, "importing torch in a subprocess"))
    time.sleep(0.4)  # one slow step: no call from the checklist meanwhile
    shown.interrupted()
    seconds = [float(t.split(" · ")[1].removesuffix(" s")) for t in _texts(frames) if t.startswith("Checking")]
    assert len(seconds) >= 4 and seconds == sorted(seconds) and seconds[-1] > seconds[0] + 0.2
    assert "interrupted after" in _texts(frames)[-1]
    count = len(frames)
    time.sleep(0.2)
    assert len(frames) == count  # the ticker ended with the check


def test_outside_a_kernel_each_step_is_one_line_on_stderr(capsys):
    shown = CheckProgress(None)
    for message in ("importing torch in a subprocess", "importing torch in a subprocess", "running: matrix-multiply"):
        shown.update(CheckReport((), 0.0, False, None, message))
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpucheck: importing torch in a subprocess", "gpucheck: matrix-multiply"]


def test_progress_view_escapes_and_says_the_step():
    p = Progress("Checking the setup", 4.25, "<b>x</b>", 2, 6, "note")
    assert progress_text(p) == "Checking the setup… · 4.2 s · step 2 of 6: <b>x</b>"
    html = progress_html(p)
    assert "&lt;b&gt;x&lt;/b&gt;" in html and 'aria-valuenow="2"' in html and "<b>x</b>" not in html


def test_fit_progress_names_the_trial_of_at_most_n(monkeypatch):
    from gpunb.shells.fit_progress import FitProgress

    frames = _capture(monkeypatch)
    shown = FitProgress(KernelShell(), max_trials=6, steps=50, tick_s=60)
    shown("trial 2: batch 512 (candidate)…")
    shown("done: 3 trials of 50 steps in 9.1 s; recommended batch: 480")
    texts = _texts(frames)
    assert "trial 2 of at most 6: batch 512 (candidate)…" in texts[0] and "Finding the largest batch" in texts[0]
    assert texts[1].endswith("trial 2 of at most 6: done: 3 trials of 50 steps in 9.1 s; recommended batch: 480")
    shown.finish("the result")
    assert frames[-1] == "the result"


def test_cancel_interrupts_only_the_running_magic_once(monkeypatch):
    pytest.importorskip("ipywidgets")
    import signal

    import gpunb.shells.cancel_button as cancel_module

    sent = []
    monkeypatch.setattr(cancel_module.os, "kill", lambda pid, sig: sent.append(sig))
    button = cancel_module.CancelButton("the check")
    button.button.click()
    button.button.click()  # a second click while it stops: nothing more
    assert sent == [signal.SIGINT] and button.cancelled and button.button.description == "Cancelling…"
    late = cancel_module.CancelButton("the check")
    late.done()
    late.button.click()  # the magic has ended: a late click interrupts nothing
    assert sent == [signal.SIGINT] and not late.cancelled
    assert cancel_module.CancelButton.shown("the check", None) is None  # no kernel: no button
