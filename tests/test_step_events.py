"""Step timing from CUDA events: read back only what has completed, reuse events, never block
mid-cell, an event every step only while the GPU lags the host. A stand-in GPU decides when
each event completes; real events are checked on the H200 in tests/gpu/test_profile_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpunb.analysis.steps.events import FIRST_READ_BACK, MIN_GAP_S, READ_BACK_EVERY, StepEvents, per_step_ms


class SimulatedGpu:
    """Events complete when ``done_ms`` passes their GPU timestamp; like CUDA, reading the
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

            def elapsed_time(self, other: Event) -> float:
                if not (self.query() and other.query()):
                    raise RuntimeError("CUDA error: device not ready")
                return other.at_ms - self.at_ms

        self.Event = Event
        self.torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event), _C=SimpleNamespace())


def step_ms(i: int) -> float:
    return 1.0 + (i % 7) * 0.25  # uneven steps, so a shifted pairing would show


def run_host_bound(gpu: SimulatedGpu, events: StepEvents, n: int) -> list[float]:
    """The GPU keeps up: each step's work is done before the host ends the next step."""
    host_t, host_ms = 0.0, []
    for i in range(n):
        gpu.done_ms = gpu.queued_ms + 0.5 * step_ms(i)  # earlier steps done, halfway through this one
        gpu.queued_ms += step_ms(i)
        host_t += step_ms(i) / 1000
        host_ms.append(step_ms(i))
        events.step(i, host_t)
    return host_ms


def test_a_host_bound_loop_gets_sparse_events_and_exact_totals():
    gpu = SimulatedGpu()
    start = gpu.Event(enable_timing=True)
    start.record()
    gpu.queued_ms += 5.0  # setup before the first step
    events = StepEvents(gpu.torch, 0, start)
    n = 3000
    host_ms = run_host_bound(gpu, events, n)
    events.finish()
    # every step until the first read-back shows the GPU keeping up, then one per MIN_GAP_S
    expected = FIRST_READ_BACK + sum(step_ms(i) for i in range(FIRST_READ_BACK, n)) / 1000 / MIN_GAP_S
    assert 0.9 * expected <= events.recorded <= expected + 2  # a gap overshoots by part of a step
    assert gpu.made <= READ_BACK_EVERY + 2  # reused after read-back, not one per event
    assert gpu.synchronized == 1  # only at the end of the cell
    times = per_step_ms(events.spans, host_ms)
    assert times[0] == pytest.approx(5.0 + step_ms(0))
    assert times[1:] == pytest.approx([step_ms(i) for i in range(1, n)])  # host shape, GPU totals


def test_a_gpu_that_lags_gets_an_event_every_step_and_is_never_waited_for():
    gpu = SimulatedGpu()
    events = StepEvents(gpu.torch, 0)
    for i in range(500):
        gpu.queued_ms += step_ms(i)
        events.step(i, i * 0.0002)  # the host enqueues far faster than the GPU runs
        gpu.done_ms = max(0.0, gpu.queued_ms - 40 * 1.75)  # ~40 steps behind
    assert gpu.synchronized == 0
    assert 0 < len(events.spans) < 499  # what had completed, nothing more
    events.finish()
    assert events.recorded == 500
    assert sorted(first for first, last, _ in events.spans) == list(range(1, 500))  # one step each
    times = per_step_ms(events.spans, [0.2] * 500)
    assert times[1:] == pytest.approx([step_ms(i) for i in range(1, 500)])


def test_an_older_event_still_running_on_another_stream_waits_for_the_next_read_back():
    gpu = SimulatedGpu()
    events = StepEvents(gpu.torch, 0)
    for i in range(READ_BACK_EVERY - 1):
        gpu.queued_ms += 1.0
        events.step(i, i * 1e-4)

    class SideStreamEvent(gpu.Event):
        def record(self) -> None:
            self.at_ms = 0.0  # done at once

    events._free.append(SideStreamEvent(enable_timing=True))
    events.step(READ_BACK_EVERY - 1, 1.0)  # triggers a read-back: newest done, older not
    assert events.spans == []  # nothing read that had not completed, and no exception
    gpu.done_ms = gpu.queued_ms
    events.finish()
    assert len(events.spans) == READ_BACK_EVERY - 1


def test_per_step_ms_splits_a_span_by_host_time_and_keeps_uncovered_steps():
    host = [10.0, 1.0, 3.0, 4.0, 2.0]
    spans = [(0, 0, 12.0), (1, 3, 16.0)]  # step 4 came after the last event
    assert per_step_ms(spans, host) == pytest.approx([12.0, 2.0, 6.0, 8.0, 2.0])
    assert per_step_ms([(1, 2, 6.0)], [1.0, 0.0, 0.0]) == pytest.approx([1.0, 3.0, 3.0])  # no host time: even
