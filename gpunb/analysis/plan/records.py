"""The records of a plan: the step's peak on a GPU, where it is, and the answer for each GPU named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.memory.alloc_records import MemoryTrace
from gpunb.display import DisplayMixin


@dataclass(frozen=True)
class GpuAnswer:
    """Whether the planned batch fits one GPU, and the largest batch that does."""

    name: str
    usable_bytes: int  # for torch's allocator
    total_bytes: int
    source: str
    fits: bool
    spare_bytes: int  # usable less the peak's upper bound (negative: short by that much)
    largest_batch: int | None  # None: not searched (the plan failed) ; 0: not even batch 1
    largest_exact: bool = True  # False: the search stopped at its limit (the answer is at least this)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class StepPlan(DisplayMixin):
    """``gpunb.plan(step, batch_size)``: the step's peak GPU memory, predicted without a GPU."""

    step_name: str = ""
    batch_size: int = 0
    problem: str = ""  # the one sentence when the step could not be planned; "" when planned
    peak_bytes: int = 0  # torch's max_memory_allocated over a training run (first and later steps)
    peak_reserved_bytes: int = 0  # max_memory_reserved
    first_step_peak_bytes: int = 0
    steady_peak_bytes: int = 0
    before_bytes: int = 0  # allocated before the step: weights and what the model already had
    context_bytes: int = 0  # the CUDA context and libraries, outside torch's allocator
    band_under: float = 0.0  # the peak may be this fraction higher than planned (worst seen)
    band_over: float = 0.0  # ... or this fraction lower
    peak_where: str = ""  # "line 7, the backward of `attn`"
    peak_by_role: dict[str, int] = field(default_factory=dict)
    per_sample_bytes: float | None = None  # the peak's growth per sample (from two planned batches)
    per_sample_reserved_bytes: float | None = None  # the reserved peak's, between the two largest planned batches
    line_batch: int = 0  # the largest planned batch, where that line starts
    line_reserved_bytes: int = 0  # its reserved peak
    gpus: tuple[GpuAnswer, ...] = ()
    trace: MemoryTrace | None = None  # by line and role, %%gpumem --trace's record
    notes: list[str] = field(default_factory=list)  # what could not be modelled
    planned_on: str = ""  # the stand-ins' device
    calibrated_on: str = ""
    seconds: float = 0.0
    batches_planned: tuple[int, ...] = ()

    _dict_extras = ("headline", "ok", "needs_bytes")

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def needs_bytes(self) -> int:
        """What a GPU must have for the batch: the reserved peak with its band, and the context."""
        return int(self.peak_reserved_bytes * (1 + self.band_under)) + self.context_bytes

    @property
    def headline(self) -> str:
        from gpunb import units

        if self.problem:
            return f"no plan: {self.problem}"
        where = f" ({self.peak_where})" if self.peak_where else ""
        head = (f"batch {self.batch_size} needs {units.gib(self.needs_bytes, digits=1)} at its peak{where}")
        if not self.gpus:
            return head
        g = self.gpus[0]
        if g.fits:
            fit = (f"fits {_a(g.name)} ({units.gib(g.usable_bytes, digits=1)} usable) with "
                   f"{units.gib(g.spare_bytes, digits=1)} to spare")
        else:
            fit = f"does not fit {_a(g.name)} ({units.gib(g.usable_bytes, digits=1)} usable)"
        if g.largest_batch is None:
            return f"{head}: {fit}"
        if g.largest_batch == 0:
            return f"{head}: {fit}; not even batch 1 fits there"
        more = "" if g.largest_exact else " or more"
        return f"{head}: {fit}; the largest batch on {_a(g.name)} is ≈ {g.largest_batch}{more}"

    def largest_batch_for(self, total_bytes: int, non_torch_bytes: int | None = None) -> int | None:
        """The largest batch the plan's line says fits a GPU of ``total_bytes`` of which ``non_torch_bytes``
        are not torch's (None: the plan's context), allowing for the band (the OOM doctor quotes it;
        the GPUs of ``gpus`` were planned, not read off a line)."""
        slope = self.per_sample_reserved_bytes or self.per_sample_bytes
        if not self.ok or not slope or slope <= 0:
            return None
        torch_bytes = total_bytes - (self.context_bytes if non_torch_bytes is None else non_torch_bytes)
        start, at = (self.line_batch, self.line_reserved_bytes) if self.line_batch else (self.batch_size,
                                                                                           self.peak_reserved_bytes)
        room = torch_bytes / (1 + self.band_under + 0.01) - at
        return max(0, int(start + room // slope))

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        out["gpus"] = [g.to_dict() for g in self.gpus]
        out["trace"] = self.trace.to_dict() if self.trace is not None else None
        for k in self._dict_extras:
            out[k] = getattr(self, k)
        return out


def _a(name: str) -> str:
    article = "an" if name[:1].upper() in "AEFHILMNORSX" and not name[:1].isdigit() else "a"
    if name[:1].isdigit():
        article = "an" if name[:1] in "8" or name.startswith(("11", "18")) else "a"
    return f"{article} {name}"
