"""The records ``%gpucheck`` produces: one :class:`CheckResult` per check, and the report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
_SEVERITY = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}


def worst(statuses: Sequence[Status]) -> Status:
    """The most severe status (fail > warn > ok > skip); ``skip`` when there are none."""
    return max(statuses, key=_SEVERITY.__getitem__, default="skip")


@dataclass(frozen=True)
class CheckResult:
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

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "summary": self.summary,
            "measured": _jsonable(self.measured),
            "cause": self.cause,
            "fix": self.fix,
            "link": self.link,
            "tip": self.tip,
        }


@dataclass(frozen=True)
class CheckReport:
    """The whole checklist. Rich display in notebooks, text in terminals, data via ``to_dict``."""

    checks: tuple[CheckResult, ...]
    duration_s: float
    quick: bool
    device: int | None = None
    in_progress: str | None = None  # set on partial reports shown while checks still run

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return not any(c.status == "fail" for c in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "fail"]

    def __getitem__(self, check_id: str) -> CheckResult:
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)

    def summary_line(self) -> str:
        counts = self.counts
        return " · ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])

    def to_dict(self) -> dict:
        return {
            "summary": self.counts,
            "ok": self.ok,
            "quick": self.quick,
            "device": self.device,
            "duration_s": round(self.duration_s, 3),
            "checks": [c.to_dict() for c in self.checks],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    # -- display (rendering lives in gpunb.views.check_view) --------------------------
    def __str__(self) -> str:
        from gpunb.views.check_view import render_text

        return render_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self) if not cycle else "CheckReport(...)")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from gpunb.views.check_view import render_html, render_text

        return {"text/plain": render_text(self), "text/html": render_html(self)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # Unavailable and friends: their reason in words
