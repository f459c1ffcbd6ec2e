"""The records ``%gpucheck`` produces: one :class:`CheckResult` per check, and the report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpunb.display import DisplayMixin, jsonable

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
_SEVERITY = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}
# (one, several): how the counts are said wherever they are said
STATUS_WORDS = {"fail": ("problem", "problems"), "warn": ("warning", "warnings"), "ok": ("ok", "ok"),
                "skip": ("skipped", "skipped")}


def worst(statuses: Sequence[Status]) -> Status:
    """The most severe status (fail > warn > ok > skip); ``skip`` when there are none."""
    return max(statuses, key=_SEVERITY.__getitem__, default="skip")


@dataclass(frozen=True)
class CheckResult(DisplayMixin):
    """One check: what it looked at, what it found, and, when not ok, why and what to do."""

    id: str
    title: str
    status: Status
    summary: str  # one line: what was measured
    measured: Mapping[str, Any] = field(default_factory=dict)
    cause: str = ""
    fix: str = ""
    link: str = ""
    tip: str = ""  # advice worth reading even when the status is ok



@dataclass(frozen=True)
class CheckReport(DisplayMixin):
    """The whole checklist. Rich display in notebooks, text in terminals, data via ``to_dict``."""

    checks: tuple[CheckResult, ...]
    duration_s: float
    quick: bool
    device: int | None = None
    in_progress: str | None = None  # set on partial reports shown while checks still run
    deep: bool = False  # the slow multi-GPU measurements ran (``--deep``)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return not any(c.status == "fail" for c in self.checks)

    @property
    def machine_state(self) -> str | None:
        """The machine's state as the driver check decided it (gpunb.analysis.machine)."""
        driver = next((c for c in self.checks if c.id == "driver"), None)
        machine = driver.measured.get("machine") if driver is not None else None
        return machine.get("state") if isinstance(machine, Mapping) else None

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "fail"]

    def __getitem__(self, check_id: str) -> CheckResult:
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)

    def summary_line(self) -> str:
        """The counts as the view's second line says them ("1 problem · 5 ok · 20 skipped"):
        one verdict, worded once, for the view, this line and the JSON's ``summary``."""
        counts = self.counts
        return " · ".join(f"{n} {STATUS_WORDS[s][n != 1]}" for s in ("fail", "warn", "ok", "skip") if (n := counts[s]))

    def to_dict(self) -> dict[str, Any]:
        # the documented JSON of `%gpucheck --json` / `gpunb check --json`: counts first
        return {
            "summary": self.counts,
            "ok": self.ok,
            "verdict": self.summary_line(),
            "machine": self.machine_state,
            "quick": self.quick,
            "deep": self.deep,
            "device": self.device,
            "duration_s": round(self.duration_s, 3),
            "checks": jsonable(self.checks),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)
