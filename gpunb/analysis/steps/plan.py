"""The few steps of a profiled cell that gpunb looks at more closely, driven by the
optimizer-step hook (``Instruments.step_watch``):

- step 2 (0-based index 1): its FLOPs and bytes are counted (:mod:`gpunb.analysis.steps.flop_count`).
  Step 1 carries the cell's warm-up, and counting has to start at a step boundary;
- with ``--ops``, steps 4-6 are traced by torch.profiler (:mod:`gpunb.analysis.steps.op_trace`).

Each slows the steps it touches, so those are left out of the median/p90 step times
(:attr:`StepPlan.excluded`). Once nothing is left to do the hook stops calling in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpunb.analysis.steps.flop_count import StepFlopCounter
from gpunb.analysis.steps.op_trace import OpTrace
from gpunb.analysis.steps.records import FlopCount, OpsReport

COUNTED_STEP = 1  # 0-based: the cell's second optimizer step


class StepPlan:
    def __init__(self, torch: Any, *, flops: bool = True, trace_path: Path | None = None) -> None:
        self.counter = StepFlopCounter(torch) if flops else None
        self.trace = OpTrace(torch, trace_path) if trace_path is not None else None
        self.steps_seen = 0

    def on_step(self, index: int) -> bool:
        """At the end of step ``index``; False once no later step needs a call."""
        self.steps_seen = index + 1
        busy = False
        try:  # both guard themselves; this is for a bug of gpunb's, which must not break the step
            counter = self.counter
            if counter is not None:
                if index == COUNTED_STEP - 1:
                    busy = counter.begin(index + 1)
                elif index == COUNTED_STEP:
                    counter.end()
            if self.trace is not None:  # after the counter: its start must not land in the counted step
                busy = self.trace.step(index) or busy
        except Exception:
            return False
        return busy

    def stop_counting(self) -> None:
        """First thing at the cell's end: a count still running (the cell ended inside the
        counted step) is dropped, so gpunb's own end-of-cell work is never counted."""
        if self.counter is not None:
            self.counter.end(complete=False)  # nothing when the count is done or never began

    def finish(self) -> OpsReport | None:
        """After the cell's GPU work has finished: stop the profiler and summarize its trace."""
        self.stop_counting()
        return self.trace.stop() if self.trace is not None else None

    def abandon(self) -> None:
        """No report after all (a Ctrl-C, a failure of gpunb's): the count and the profiler
        stop, nothing is summarized or written. Idempotent."""
        self.stop_counting()
        if self.trace is not None:
            self.trace.abandon()

    @property
    def flop_count(self) -> FlopCount | None:
        return self.counter.result if self.counter is not None else None

    @property
    def flops_why_not(self) -> str:
        counter = self.counter
        if counter is None or counter.result is not None:
            return ""
        if counter.why_not:
            return counter.why_not
        if self.steps_seen <= COUNTED_STEP:
            return (f"not counted: the cell ran {self.steps_seen} optimizer step"
                    f"{'s' if self.steps_seen != 1 else ''} (FLOPs are counted on step {COUNTED_STEP + 1})")
        return "not counted"

    @property
    def excluded(self) -> set[int]:
        """Steps whose time the closer look changed."""
        out: set[int] = set()
        counter = self.counter
        if counter is not None and counter.step is not None:
            out.add(counter.step)
        if self.trace is not None:
            out |= self.trace.touched
        return out
