"""Human-readable numbers with units, and values cut short for messages (used by every
layer's one-line summaries)."""

from __future__ import annotations

from typing import Any


def gib(n_bytes: Any, digits: int = 1) -> str:
    """1.5 GiB, 512.0 MiB, 12 B; 'n/a' for non-numbers (None, Unavailable readings).
    ``digits`` is for GiB; smaller units keep one decimal."""
    if not isinstance(n_bytes, (int, float)) or isinstance(n_bytes, bool):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.{digits if unit == 'GiB' else 1}f} {unit}"
    return f"{int(n_bytes)} B"


def seconds(t_s: float) -> str:
    if t_s >= 60:
        return f"{int(t_s // 60)} min {t_s % 60:.0f} s"
    if t_s >= 1:
        return f"{t_s:.2f} s"
    if t_s >= 1e-3:
        return f"{t_s * 1e3:.1f} ms"
    return f"{t_s * 1e6:.0f} µs"


def num(value: Any, unit: str = "", digits: int = 0) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    return f"{value:.{digits}f}{(' ' + unit) if unit else ''}"


def shown(value: str, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut short: an environment value may be a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}… ({len(value):,} characters)"
