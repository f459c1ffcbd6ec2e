"""The records of ``%gpufit`` / ``gpunb.fit_batch_size()``, filled by :mod:`gpunb.analysis.batch_fit`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpunb.display import DisplayMixin, Render


@dataclass(frozen=True)
class Trial:
    index: int
    batch: int
    ok: bool
    purpose: str  # "probe", "probe (bound)", "scout", "prediction", "back off", "bisect", "refine", "smaller start"
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    non_torch_bytes: int | None = None  # NVML process memory outside torch's reserve
    seconds: float = 0.0
    error: str = ""
    # Peak allocated up to the first optimizer.step() (forward + backward), read by a global
    # optimizer pre-step hook while the trial runs; None without a torch optimizer.
    peak_before_step_bytes: int | None = None
    base_allocated_bytes: int | None = None  # allocated when the measured step started

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (
            "index", "batch", "ok", "purpose", "peak_allocated_bytes", "peak_reserved_bytes", "non_torch_bytes",
            "seconds", "error", "peak_before_step_bytes", "base_allocated_bytes")}


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

    def to_dict(self) -> dict:
        return {"intercept_bytes": self.intercept, "slope_bytes_per_sample": self.slope}


@dataclass
class BatchFit(DisplayMixin):
    """What :func:`fit_batch_size` found. ``ok`` False: ``problem`` says why and what to do."""

    ok: bool
    problem: str = ""
    max_batch: int | None = None  # largest batch that ran (verified)
    recommended: int | None = None  # max_batch less the safety margin
    predicted: int | None = None  # the line's largest batch when the prediction was run (allocated bytes)
    predicted_reserved: int | None = None  # the same from the reserved-bytes line (coarser, lower)
    capacity_bytes: int | None = None
    margin: float = 0.05
    trials: tuple[Trial, ...] = ()
    line_reserved: Line | None = None
    line_allocated: Line | None = None
    device: str = ""
    notes: list[str] = field(default_factory=list)

    _dict_extras = ("trial_count",)

    @property
    def trial_count(self) -> int:
        return len(self.trials)

    def figure(self) -> Any:
        """The memory curve as a matplotlib Figure (imports matplotlib only now)."""
        from gpunb.views.memory_view import fit_figure

        return fit_figure(self)

    def _repr_views_(self) -> dict[str, Render]:
        from gpunb.views.memory_view import fit_html, fit_text

        # The memory curve is inside the HTML (a separate image/png would lose to the HTML
        # in JupyterLab); ``figure()`` gives it as a matplotlib Figure.
        return {"text/plain": fit_text, "text/html": fit_html}
