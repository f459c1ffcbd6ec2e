"""The records of ``%gpufit`` / ``gpunb.fit_batch_size()``, filled by :mod:`gpunb.analysis.fit.search`
(the search) and :mod:`gpunb.analysis.fit.trial` (one trial: a sustained run)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpunb.display import DisplayMixin, figure_for


@dataclass(frozen=True)
class Trial:
    index: int
    batch: int
    ok: bool  # every step ran without an out-of-memory error
    # "probe", "probe (bound)", "scout", "candidate", "refine", "beyond", "back off", "bisect", "smaller start"
    purpose: str
    peak_allocated_bytes: int | None = None  # over the steps after the first (up to the failure if it failed)
    peak_reserved_bytes: int | None = None
    non_torch_bytes: int | None = None  # NVML process memory outside torch's reserve
    seconds: float = 0.0
    error: str = ""
    # Largest peak of a step's forward+backward, read just before each optimizer.step() by a
    # global optimizer pre-step hook; None without a torch optimizer.
    peak_before_step_bytes: int | None = None
    base_allocated_bytes: int | None = None  # allocated when the last step started
    steps: int = 1  # asked for
    steps_done: int = 0
    cache_releases: int = 0  # allocations that fitted only after the allocator gave its free cache back
    caught_ooms: int = 0  # out-of-memory errors raised and caught inside the steps (cuDNN fallbacks)
    state_reset_bytes: int = 0  # optimizer state and gradients emptied before the trial (a fresh start)
    capacity_bytes: int | None = None
    first_step_peak_reserved_bytes: int | None = None  # kept apart: cuDNN's timing of a new shape

    @property
    def fits(self) -> bool:
        """Trained every step of the sustained run, within the memory the fit may use."""
        return self.ok and self.steps_done >= self.steps and not self.over_capacity

    @property
    def over_capacity(self) -> bool:
        """Trained, but its tensors took more than ``capacity_bytes`` (what the fit may use: less
        ``--margin``, which the device does not enforce): it does not count as fitting."""
        return (self.ok and self.capacity_bytes is not None and self.peak_allocated_bytes is not None
                and self.peak_allocated_bytes > self.capacity_bytes)

    @property
    def at_edge(self) -> bool:
        """Trained, but only because the allocator gave its cache back or cuDNN fell back."""
        return self.fits and bool(self.cache_releases or self.caught_ooms)

    @property
    def verdict(self) -> str:
        if self.over_capacity:
            return f"over the {(self.capacity_bytes or 0) / 2**30:.2f} GiB it may use"
        if not self.fits:
            return "out of memory" + (f" at step {self.steps_done + 1}" if self.steps > 1 else "")
        why = []
        if self.cache_releases:
            why.append(f"the allocator gave its cache back {self.cache_releases}×")
        if self.caught_ooms:
            why.append(f"cuDNN caught {self.caught_ooms} out-of-memory errors")
        return "fits" + (f" ({', '.join(why)})" if why else "")

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "index", "batch", "ok", "purpose", "peak_allocated_bytes", "peak_reserved_bytes", "non_torch_bytes",
            "seconds", "error", "peak_before_step_bytes", "base_allocated_bytes", "steps", "steps_done",
            "cache_releases", "caught_ooms", "state_reset_bytes", "capacity_bytes", "first_step_peak_reserved_bytes")}
        out["fits"] = self.fits
        out["verdict"] = self.verdict
        return out


@dataclass(frozen=True)
class Line:
    """peak(b) = intercept + slope * b (bytes)."""

    intercept: float
    slope: float

    def at(self, batch: float) -> float:
        return self.intercept + self.slope * batch

    def largest_batch(self, capacity: float) -> float:
        if self.slope <= 0:
            return math.inf
        return (capacity - self.intercept) / self.slope

    def to_dict(self) -> dict[str, Any]:
        return {"intercept_bytes": self.intercept, "slope_bytes_per_sample": self.slope}


@dataclass
class BatchFit(DisplayMixin):
    """What :func:`fit_batch_size` found. ``ok`` False: ``problem`` says why and what to do."""

    ok: bool
    problem: str = ""
    recommended: int | None = None  # the batch to use: `verified`, less `safety` when that was at the limit
    verified: int | None = None  # the largest batch whose sustained run trained, below every batch that did not
    safety: float = 0.0  # the share taken off `verified` (fresh processes vary near the limit)
    predicted: int | None = None  # the allocated-bytes line's batch at the capacity, when the first was chosen
    predicted_reserved: int | None = None  # the reserved-bytes line's, which the candidate aimed under
    capacity_bytes: int | None = None  # what the step may use (the cap, or free + torch's cache), less the margin
    margin: float = 0.0  # fraction of the memory kept free on request (--margin)
    steps: int = 50  # steps per trial (the sustained run)
    seconds: float = 0.0  # the whole search
    trials: tuple[Trial, ...] = ()
    line_reserved: Line | None = None
    line_allocated: Line | None = None
    device: str = ""
    step_name: str = ""
    notes: list[str] = field(default_factory=list)

    _dict_extras = ("trial_count", "headroom_bytes")

    @property
    def trial_count(self) -> int:
        return len(self.trials)

    @property
    def verified_trial(self) -> Trial | None:
        """The sustained run the recommendation rests on (at ``verified``)."""
        return next((t for t in reversed(self.trials) if t.fits and t.batch == self.verified), None)

    @property
    def headroom_bytes(self) -> int | None:
        """Capacity left above the verified batch's peak reserved memory, as measured."""
        t = self.verified_trial
        if t is None or self.capacity_bytes is None or t.peak_reserved_bytes is None:
            return None
        return self.capacity_bytes - t.peak_reserved_bytes

    def figure(self) -> Any:
        """The memory curve as a matplotlib Figure (imports matplotlib only now)."""
        return figure_for(self)
