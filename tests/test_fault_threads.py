"""A background thread's training steps are not the profiled cell's (issue 22: 152 and 204 steps
reported instead of 20); the report says how many other threads took."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.profile.cell import ProfileSession  # noqa: E402
from gpunb.views.profile_view import profile_text  # noqa: E402


def train(steps: int) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_steps_of_a_background_thread_are_counted_apart(fake_nvml):
    go, done = threading.Event(), threading.Event()

    def background() -> None:
        go.wait()
        train(150)
        done.set()

    worker = threading.Thread(target=background, daemon=True)
    worker.start()
    session = ProfileSession(flops=False, ranks=False).start()
    go.set()
    train(20)  # the cell's own loop
    done.wait(30)
    profile = session.stop()
    worker.join()
    assert profile.steps.count == 20
    assert profile.other_thread_steps == 150
    assert "150 optimizer steps ran in other threads" in profile_text(profile)


def test_a_cell_without_other_threads_says_nothing_of_them(fake_nvml):
    session = ProfileSession(flops=False, ranks=False).start()
    train(5)
    profile = session.stop()
    assert profile.steps.count == 5 and profile.other_thread_steps == 0
    assert "other threads" not in profile_text(profile)
