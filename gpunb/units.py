"""Human-readable numbers with units: the one set of formatters every view and summary uses,
and values cut short for messages (an environment value may be a megabyte).

A missing reading (None, an ``Unavailable`` NVML value, NaN) reads "n/a", never a crash.
"""

from __future__ import annotations

import math
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def gib(n_bytes: Any, digits: int = 1) -> str:
    """1.5 GiB, 512.0 MiB, 12 B; 'n/a' for non-numbers (None, Unavailable readings).
    ``digits`` is for GiB; smaller units keep one decimal."""
    if not _number(n_bytes):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.{digits if unit == 'GiB' else 1}f} {unit}"
    return f"{int(n_bytes)} B"


def seconds(t_s: Any) -> str:
    """2 min 5 s, 1.25 s, 12.5 ms, 40 µs; 'n/a' for a missing time."""
    if not _number(t_s):
        return "n/a"
    if t_s >= 60:
        return f"{int(t_s // 60)} min {t_s % 60:.0f} s"
    if t_s >= 1:
        return f"{t_s:.2f} s"
    if t_s >= 1e-3:
        return f"{t_s * 1e3:.1f} ms"
    return f"{t_s * 1e6:.0f} µs"


def milliseconds(t_ms: Any) -> str:
    """A time given in milliseconds, written like :func:`seconds`."""
    return seconds(t_ms / 1000.0) if _number(t_ms) else "n/a"


def num(value: Any, unit: str = "", digits: int = 0) -> str:
    if not _number(value):
        return "n/a"
    return f"{value:.{digits}f}{(' ' + unit) if unit else ''}"


def shown(value: str, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut short: an environment value may be a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}… ({len(value):,} characters)"


def flop_count(n: Any) -> str:
    """138.1 MFLOP, 26.39 TFLOP, 1.10 PFLOP (floating-point operations, not per second)."""
    if not _number(n):
        return "n/a"
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.{2 if abs(n) / size < 100 else 1}f} {unit}"
    return f"{int(n)} FLOP"


def flop_rate(per_s: Any) -> str:
    """A rate as the datasheets write it: 412 TFLOP/s, 3.1 TFLOP/s, 85.2 GFLOP/s."""
    if not _number(per_s):
        return "n/a"
    for unit, size in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if abs(per_s) >= size:
            value = per_s / size
            return f"{value:.{0 if value >= 100 else 1}f} {unit}"
    return f"{per_s:.0f} FLOP/s"


def byte_rate(per_s: Any) -> str:
    """Memory bandwidth in decimal units, as GPU datasheets give it: 3.21 TB/s, 812 GB/s."""
    if not _number(per_s):
        return "n/a"
    if abs(per_s) >= 1e12:
        return f"{per_s / 1e12:.2f} TB/s"
    if abs(per_s) >= 1e9:
        return f"{per_s / 1e9:.0f} GB/s" if abs(per_s) >= 1e11 else f"{per_s / 1e9:.1f} GB/s"
    return f"{per_s / 1e6:.1f} MB/s"


def energy(joules: float, like: float | None = None) -> str:
    """An amount of energy as people read it: 512 J, 4.2 Wh, 70 Wh, 3.21 kWh; in the unit
    ``like`` (joules) would take, when given: the parts of a total read in the total's unit."""
    wh = joules / 3600.0
    unit_wh = (like if like is not None else joules) / 3600.0
    if unit_wh < 1:
        return f"{joules:,.0f} J"
    if unit_wh < 1000:
        return f"{wh:,.2f} Wh" if wh < 1 else f"{wh:,.1f} Wh" if wh < 10 else f"{wh:,.0f} Wh"
    return f"{wh / 1000:,.2f} kWh"
