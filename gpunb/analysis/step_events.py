"""GPU time of every training step from CUDA events, without a synchronize per step.

Each step records one timing event on the current stream of the cell's device; the GPU
time of step ``j`` is the time between the events of steps ``j-1`` and ``j``. Events are
read back in batches once they have completed, and then used again, so a long cell holds
a bounded pool of events instead of creating and destroying one per step.

What one step costs the host (``benchmarks/profile_overhead.py`` times it on the device):
``torch.cuda.Event.record()`` looks up the current stream in Python and builds a
``Stream`` object on every call; here the stream is asked for by its C call and the
``Stream`` object kept until it changes, and the event is recorded by the C method.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

READ_BACK_EVERY = 64  # steps between read-backs (a read-back of completed events costs ~1 µs each)


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
    """``record(index)`` at each step end; ``finish()`` at the cell's end; then ``gpu_ms``."""

    def __init__(self, torch: Any, device: int, start_event: Any = None) -> None:
        self._new = lambda: torch.cuda.Event(enable_timing=True)
        self._record = _recorder(torch, device)
        self._start = start_event  # recorded when the cell began: step 0's GPU time starts there
        self._free: list[Any] = []
        self._pending: deque = deque()  # (step index, event) recorded, not yet read back
        self.gpu_ms: dict[int, float] = {}  # step index -> GPU ms since the previous step's event
        self.recorded = 0

    def record(self, index: int) -> None:
        event = self._free.pop() if self._free else self._new()
        self._record(event)
        self.recorded += 1
        pending = self._pending
        pending.append((index, event))
        if len(pending) >= READ_BACK_EVERY:
            self._read_back(block=False)

    def finish(self) -> None:
        """Read back every step (waits for the GPU once, at the end of the cell)."""
        self._read_back(block=True)
        self._pending.clear()

    def _read_back(self, block: bool) -> None:
        pending = self._pending
        if not pending:
            return
        if block:
            pending[-1][1].synchronize()
        # Events on one stream complete in order: if the newest is done, all are (one query,
        # not one per event). Had the user switched streams mid-cell, an older event may still
        # be running: elapsed_time() then raises (not ready) and the rest waits for later.
        all_done = block or pending[-1][1].query()
        if len(pending) == 1 and all_done:
            self._first(*pending[0])
        while len(pending) >= 2 and (all_done or pending[1][1].query()):
            (i, a), (j, b) = pending[0], pending[1]
            try:
                self._first(i, a)
                self.gpu_ms[j] = a.elapsed_time(b)
            except RuntimeError:
                if block:
                    raise
                break
            pending.popleft()
            self._free.append(a)

    def _first(self, index: int, event: Any) -> None:
        if index == 0 and self._start is not None and 0 not in self.gpu_ms:
            self.gpu_ms[0] = self._start.elapsed_time(event)  # warm-up and setup before step 0
