"""GPU time of training steps from CUDA events, without a synchronize per step.

A step end records a timing event on the current stream of the cell's device; the GPU time
between two events is what the steps between them took. Events are read back in batches
once they have completed, then used again (a bounded pool, not one event per step).

How often: recording an event is a driver call (~7 µs on the H200 VM, per-call table of
benchmarks/profile_overhead.py) that a host-bound loop pays in full. So each read-back
(the first after ``FIRST_READ_BACK`` steps) also asks whether the GPU keeps up with the host:

- the GPU is a step or more behind (GPU-bound): the host has slack, an event costs the loop
  nothing, so every step gets its own event;
- the GPU keeps up (host-bound): events at most every ``MIN_GAP_S`` of host time, and the
  steps between two events share their GPU time in proportion to their host times (in a
  host-bound loop the GPU follows the host, so host step times have the right shape).

Events then cost a host-bound loop one record per 100 ms, whatever the step length (~7 µs
alone in a tight loop; amid a training step's code, with its read-backs, ~63 µs on the H200
machine: 3.2 µs a step of a 2.5 ms loop at one per 50 ms, benchmarks/profile_overhead.py,
so the gap is 100 ms: ~0.06 %).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

READ_BACK_EVERY = 64  # events between read-backs (a read-back costs ~1 µs per event)
FIRST_READ_BACK = 8  # the first one comes early: it decides how often to record
MIN_GAP_S = 0.1  # host time between events while the GPU keeps up with the host


def _recorder(torch: Any, device: int) -> Callable[[Any], None]:
    """``record(event)`` on the current stream of ``device``, by the cheapest path torch offers."""
    cuda = torch.cuda
    base = getattr(torch._C, "_CudaEventBase", None)
    current = getattr(torch._C, "_cuda_getCurrentStream", None)
    if base is None or current is None or not (isinstance(cuda.Event, type) and issubclass(cuda.Event, base)):
        return lambda event: event.record()  # another torch layout (or a test stand-in): the public call
    record = base.record
    seen: list[Any] = [None, None]  # (the stream's (id, device, type) triple, its Stream object)

    def record_on_current_stream(event: Any) -> None:
        key = current(device)
        if key != seen[0]:  # the user switched streams: one public lookup, then cached again
            seen[0], seen[1] = key, cuda.current_stream(device)
        record(event, seen[1])

    return record_on_current_stream


class StepEvents:
    """``step(index, t)`` at each step end (``t``: host clock); ``finish()`` at the cell's end;
    then ``spans``: (first step, last step, GPU ms) covering those steps."""

    def __init__(self, torch: Any, device: int, start_event: Any = None, min_gap_s: float | None = None) -> None:
        self._new: Callable[[], Any] = lambda: torch.cuda.Event(enable_timing=True)
        self._record = _recorder(torch, device)
        self._start = start_event  # recorded when the cell began: step 0's GPU time starts there
        self.min_gap_s = MIN_GAP_S if min_gap_s is None else min_gap_s
        self._gap = 0.0  # every step until a read-back sees the GPU keeping up
        self._last_t = float("-inf")
        self._free: list[Any] = []
        self._pending: deque[tuple[int, Any]] = deque()  # (step index, event) recorded, not yet read back
        self.spans: list[tuple[int, int, float]] = []
        self.recorded = 0
        self._read_back_at = FIRST_READ_BACK

    def step(self, index: int, t: float) -> None:
        if t - self._last_t < self._gap:
            return
        self._last_t = t
        event = self._free.pop() if self._free else self._new()
        self._record(event)
        self.recorded += 1
        pending = self._pending
        pending.append((index, event))
        if len(pending) >= self._read_back_at:
            self._read_back(block=False)
            self._read_back_at = READ_BACK_EVERY

    def finish(self) -> None:
        """Read back every event (waits for the GPU once, at the end of the cell)."""
        self._read_back(block=True)
        self._pending.clear()

    def _read_back(self, block: bool) -> None:
        pending = self._pending
        if not pending:
            return
        if block:
            pending[-1][1].synchronize()
            ready = len(pending)
        elif pending[-1][1].query():  # the GPU has caught up with the host entirely
            ready = len(pending)
        elif len(pending) >= 2 and pending[-2][1].query():  # it is finishing the newest step
            ready = len(pending) - 1
        else:  # a step or more behind: the host has slack, so time every step
            ready = 0
            while ready < len(pending) and pending[ready][1].query():
                ready += 1
        if not block:
            self._gap = self.min_gap_s if ready >= len(pending) - 1 else 0.0
        # Events on one stream complete in order, so one query above vouches for the older
        # ones. Had the user switched streams mid-cell, an older event may still be running:
        # elapsed_time() then raises (not ready) and the rest waits for the next read-back.
        try:
            if ready and pending[0][0] == 0 and self._start is not None and not self.spans:
                # step 0 runs from the cell's start: warm-up and setup before the first step
                self.spans.append((0, 0, self._start.elapsed_time(pending[0][1])))
            while ready >= 2:
                (i, a), (j, b) = pending[0], pending[1]
                self.spans.append((i + 1, j, a.elapsed_time(b)))
                pending.popleft()
                self._free.append(a)
                ready -= 1
        except RuntimeError:
            if block:
                raise


def per_step_ms(spans: list[tuple[int, int, float]], host_ms: list[float]) -> list[float]:
    """Every step's time: its own event's where it has one, else its host-time share of the
    span's GPU time; host time for steps no event covers (CUDA started mid-cell)."""
    times = list(host_ms)
    for first, last, ms in spans:
        if first == last:
            times[first] = ms
            continue
        host = sum(host_ms[first:last + 1])
        n = last - first + 1
        for k in range(first, last + 1):
            times[k] = ms * (host_ms[k] / host if host > 0 else 1 / n)
    return times
