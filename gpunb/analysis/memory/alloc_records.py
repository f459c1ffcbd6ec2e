"""The records of a traced cell (``%%gpumem --trace``) and of the OOM doctor's allocation sites."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpunb.display import DisplayMixin

# The roles memory is split by over time (how each is decided: docs/memory-trace.md).
TRACE_ROLES = ("parameters", "gradients", "optimizer state", "activations", "temporaries", "other")


@dataclass(frozen=True)
class AllocSite:
    """Bytes that one line of the user's code allocated (and that were alive at the moment looked at)."""

    label: str  # "In [12] line 7: h = self.fc1(x)"
    nbytes: int
    blocks: int
    stack: tuple[str, ...] = ()  # the user's frames, outermost first
    role: str = ""  # the role of most of these bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimelinePoint:
    t: float  # ms since the first event (or the event's number, when torch gave no times)
    by_role: tuple[int, ...]  # bytes, in TRACE_ROLES order

    @property
    def total(self) -> int:
        return sum(self.by_role)


@dataclass
class MemoryTrace(DisplayMixin):
    """One cell's allocations: the peak, who made it (by line, by role), the timeline."""

    label: str = ""
    unavailable: str = ""  # why nothing was recorded (one sentence with the fix); "" when recorded
    device: int | None = None
    events: int = 0  # alloc/free events of the cell
    baseline_bytes: int = 0  # allocated when the cell started
    end_bytes: int = 0
    peak_bytes: int = 0  # the timeline's maximum
    peak_t: float = 0.0
    torch_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated() over the cell
    peak_by_role: dict[str, int] = field(default_factory=dict)
    sites_at_peak: tuple[AllocSite, ...] = ()  # largest first
    points: tuple[TimelinePoint, ...] = ()
    time_unit: str = "ms"  # "ms", or "event" when the events carry no time
    saved_path: str = ""
    saved_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    error: str = ""  # the cell's exception type, when it failed
    oom_at: str = ""  # the line whose request ran out of memory, when one did ("" otherwise)
    oom_bytes: int | None = None  # what that request asked

    _dict_extras = ("headline",)

    @property
    def headline(self) -> str:
        if self.unavailable:
            return f"no memory trace: {self.unavailable}"
        from gpunb import units

        if self.oom_at:
            asked = f" asking {units.gib(self.oom_bytes, digits=2)}" if self.oom_bytes else ""
            return (f"out of memory at {self.oom_at}{asked}, with {units.gib(self.peak_bytes, digits=2)} "
                    "allocated at the peak")
        if not self.events:
            return "this cell allocated no CUDA memory"
        top = self.sites_at_peak[0] if self.sites_at_peak else None
        peak = f"peak {units.gib(self.peak_bytes, digits=2)}"
        if top is None:
            return peak
        return f"{peak}; the largest share, {units.gib(top.nbytes, digits=2)}, from {top.label}"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        out["sites_at_peak"] = [s.to_dict() for s in self.sites_at_peak]
        out["points"] = [[p.t, *p.by_role] for p in self.points]
        out["roles"] = list(TRACE_ROLES)
        out["headline"] = self.headline
        return out


@dataclass(frozen=True)
class OomSites:
    """What the armed history says about an OOM: the line whose request failed, and the lines
    that allocated the largest blocks still alive."""

    failed_at: str  # the failing request's site ("" when the history saw no oom event)
    failed_stack: tuple[str, ...]
    requested_bytes: int | None
    live: tuple[AllocSite, ...]  # largest first

    def to_dict(self) -> dict[str, Any]:
        return {"failed_at": self.failed_at, "failed_stack": list(self.failed_stack),
                "requested_bytes": self.requested_bytes, "live": [s.to_dict() for s in self.live]}
