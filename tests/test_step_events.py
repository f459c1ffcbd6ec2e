"""Step timing from CUDA events: read back only what has completed, reuse events, never block
mid-cell. A stand-in GPU decides when each event completes; real events are checked on
the H200 in tests/gpu/test_profile_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpunb.analysis.step_events import READ_BACK_EVERY, StepEvents


class SimulatedGpu:
    """Events complete when ``run_until`` passes their GPU timestamp; like CUDA, reading the
    time of an event that has not completed raises (cudaErrorNotReady)."""

    def __init__(self) -> None:
        self.queued_ms = 0.0  # GPU time at which the work queued so far ends
        self.done_ms = 0.0  # the GPU has finished everything up to here
        self.made = 0
        self.synchronized = 0
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                gpu.made += 1
                self.at_ms: float | None = None

            def record(self) -> None:
                self.at_ms = gpu.queued_ms

            def query(self) -> bool:
                return self.at_ms is not None and self.at_ms <= gpu.done_ms

            def synchronize(self) -> None:
                gpu.synchronized += 1
                gpu.done_ms = max(gpu.done_ms, self.at_ms)

            def elapsed_time(self, other: "Event") -> float:
                if not (self.query() and other.query()):
                    raise RuntimeError("CUDA error: device not ready")
                return other.at_ms - self.at_ms

        self.Event = Event
        self.torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event), _C=SimpleNamespace())

    def queue(self, ms: float) -> None:
        self.queued_ms += ms


def step_ms(i: int) -> float:
    return 1.0 + (i % 7) * 0.25  # uneven steps, so a shifted pairing would show


def test_every_step_timed_with_a_bounded_pool_of_events():
    gpu = SimulatedGpu()
    start = gpu.Event(enable_timing=True)
    start.record()
    gpu.queue(5.0)  # setup before the first step
    events = StepEvents(gpu.torch, 0, start)
    for i in range(1000):
        gpu.queue(step_ms(i))
        events.record(i)
        gpu.done_ms = gpu.queued_ms  # a host-bound loop: the GPU keeps up
    events.finish()
    assert events.gpu_ms[0] == pytest.approx(5.0 + step_ms(0))
    assert [events.gpu_ms[i] for i in range(1, 1000)] == pytest.approx([step_ms(i) for i in range(1, 1000)])
    assert gpu.made <= READ_BACK_EVERY + 2  # reused after read-back, not one per step
    assert gpu.synchronized == 1  # only at the end of the cell


def test_a_gpu_that_lags_is_never_waited_for_mid_cell():
    gpu = SimulatedGpu()
    events = StepEvents(gpu.torch, 0)
    for i in range(500):
        gpu.queue(step_ms(i))
        events.record(i)
        gpu.done_ms = max(0.0, gpu.queued_ms - 40 * 1.75)  # a GPU-bound loop: ~40 steps behind
    assert gpu.synchronized == 0
    assert 0 < len(events.gpu_ms) < 499  # what had completed, nothing more
    events.finish()
    assert sorted(events.gpu_ms) == list(range(1, 500))  # no start event: step 0 has no GPU time
    assert [events.gpu_ms[i] for i in range(1, 500)] == pytest.approx([step_ms(i) for i in range(1, 500)])


def test_an_older_event_still_running_on_another_stream_waits_for_the_next_read_back():
    gpu = SimulatedGpu()
    events = StepEvents(gpu.torch, 0)
    for i in range(READ_BACK_EVERY - 1):
        gpu.queue(1.0)
        events.record(i)
    # the newest event completes before the older ones (it went to an idle side stream)
    class SideStreamEvent(gpu.Event):
        def record(self) -> None:
            self.at_ms = 0.0  # done at once

    events._free.append(SideStreamEvent(enable_timing=True))
    events.record(READ_BACK_EVERY - 1)  # triggers a read-back: newest done, older not
    assert events.gpu_ms == {}  # nothing read that had not completed, and no exception
    gpu.done_ms = gpu.queued_ms
    events.finish()
    assert len(events.gpu_ms) == READ_BACK_EVERY - 1
