"""Advice: concrete suggestions tied to the measurement that justifies them.

Checks, cell profiles and the OOM doctor each produce :class:`Advice` items; ``ranked``
orders them the same way everywhere, so the most valuable fix is always first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Advice:
    """One suggestion. ``reason`` quotes the measurement; ``gain`` is the estimated
    benefit as a fraction (0.3 = 30 % faster or 30 % less memory), when it can be estimated."""

    title: str  # imperative, short: "Use bf16 autocast"
    reason: str  # the measured why: "matmuls ran in fp32 at 9 % of this GPU's bf16 peak"
    how: str = ""  # code or command to apply it
    gain: float | None = None
    link: str = ""
    severity: int = 1  # 2 = fixes a failure, 1 = improves, 0 = nice to know
    saving_bytes: int | None = None  # memory it saves, where that is what it is about (the OOM doctor)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "reason": self.reason,
            "how": self.how,
            "gain": self.gain,
            "link": self.link,
            "severity": self.severity,
            "saving_bytes": self.saving_bytes,
        }


def ranked(items: list[Advice] | tuple[Advice, ...]) -> list[Advice]:
    """Failures first, then by estimated gain (unknown gains after known ones)."""
    return sorted(items, key=lambda a: (-a.severity, -(a.gain if a.gain is not None else -1.0)))
