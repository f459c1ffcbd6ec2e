"""The records of the OOM doctor, filled by :mod:`gpunb.analysis.memory.oom`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpunb import units
from gpunb.analysis.advice import Advice
from gpunb.analysis.memory.alloc_records import OomSites
from gpunb.analysis.memory.census import Census
from gpunb.analysis.memory.oom_message import OomMessage
from gpunb.analysis.memory.release import ReleaseReport
from gpunb.display import DisplayMixin
from gpunb.readings.torch_state import AllocatorStats


@dataclass(frozen=True)
class Cause:
    code: str
    summary: str  # one line, with the numbers
    bytes: int | None = None  # how much memory this cause accounts for

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "summary": self.summary, "bytes": self.bytes}


@dataclass(frozen=True)
class OtherProcess:
    pid: int
    used_bytes: int | None
    name: str = ""
    holder: str = ""  # whose it is, from the Jupyter server: "lesson3.ipynb (idle 40 min)"

    @property
    def label(self) -> str:
        return self.holder or f"PID {self.pid}{' (' + self.name + ')' if self.name else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_bytes": self.used_bytes, "name": self.name, "holder": self.holder}


@dataclass
class OomDiagnosis(DisplayMixin):
    """What one OOM was, why, what to change; and (after release) what came back."""

    exception_type: str
    message: OomMessage | None
    causes: list[Cause]
    fixes: list[Advice]
    census: Census | None = None
    torch_memory: AllocatorStats | None = None
    other_processes: tuple[OtherProcess, ...] = ()
    this_process_bytes: int | None = None  # NVML
    release: ReleaseReport | None = None  # filled when the memory was given back
    notes: list[str] = field(default_factory=list)
    requested_bytes: int | None = None  # the allocation that failed
    free_bytes: int | None = None  # what it could have had: free on the device, or left under the cap
    alloc_sites: OomSites | None = None  # the lines behind the failed request and the live blocks (history armed)

    _dict_extras = ("headline", "shortfall_bytes")

    @property
    def primary_cause(self) -> str | None:
        return self.causes[0].code if self.causes else None

    @property
    def shortfall_bytes(self) -> int | None:
        if self.requested_bytes is None or self.free_bytes is None:
            return None
        return max(0, self.requested_bytes - self.free_bytes)

    @property
    def headline(self) -> str:
        """The failure in numbers: "asked 20.00 GiB, 3.20 GiB free: short by 16.80 GiB"."""
        if self.requested_bytes is None:
            return "the message does not say how much was asked"
        if self.free_bytes is None:
            return f"asked {units.gib(self.requested_bytes, digits=2)}"
        return (f"asked {units.gib(self.requested_bytes, digits=2)}, {units.gib(self.free_bytes, digits=2)} free: "
                f"short by {units.gib(self.shortfall_bytes, digits=2)}")
