"""Profiled cells of this kernel, in order, and how two of them compare.

A comparison reads like a lab note: "1.8x faster, 35 % less memory". Speed compares
samples/s when both runs know their batch size and it differs (a larger batch takes longer
per step but may train faster), else the median step time when both runs have steps, else
the wall time; memory compares torch's peak allocated bytes when both ran on a GPU, else
the peak resident memory. When both counted their FLOPs on the same GPU model, the MFU
(datasheet basis) of each is named too: "MFU from 21% to 48%".
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # profile_records' display imports views/profile_view, which imports this module
    from gpunb.analysis.profile_records import CellProfile

MAX_ENTRIES = 500  # a day of profiling; each entry is a few KB


@dataclass(frozen=True)
class Comparison:
    speedup: float | None  # > 1: the later run is faster
    speed_basis: str  # "samples/s" | "median step" | "wall time"
    memory_ratio: float | None  # later / earlier
    memory_basis: str  # "peak VRAM" | "peak RSS"
    mfu: tuple[float, float] | None = None  # (earlier, later), each against its own precision's datasheet peak
    mfu_precisions: tuple[str, str] = ("", "")  # the precision most FLOPs ran in, earlier and later

    def words(self) -> str:
        parts = []
        if self.speedup is not None:
            if abs(self.speedup - 1) < 0.03:
                parts.append("same speed")
            elif self.speedup > 1:
                parts.append(f"{self.speedup:.1f}x faster")
            else:
                parts.append(f"{1 / self.speedup:.1f}x slower")
        if self.memory_ratio is not None:
            change = 1 - self.memory_ratio
            if abs(change) < 0.03:
                parts.append("same memory")
            elif change > 0:
                parts.append(f"{100 * change:.0f}% less memory")
            else:
                parts.append(f"{100 * -change:.0f}% more memory")
        if self.mfu is not None:
            (before, after), (p0, p1) = (round(100 * x) for x in self.mfu), self.mfu_precisions
            if p0 != p1:  # each MFU is against its own precision's peak: say which
                parts.append(f"MFU from {before}% ({p0}) to {after}% ({p1})")
            else:
                parts.append(f"MFU {before}%" if before == after else f"MFU from {before}% to {after}%")
        return ", ".join(parts)


def _speed(p: Any) -> tuple[float | None, str]:
    if p.steps.median_ms:
        return p.steps.median_ms, "median step"
    return p.wall_s, "wall time"


def _memory(p: Any) -> tuple[float | None, str]:
    if p.gpu is not None and p.gpu.peak_allocated_bytes:
        return p.gpu.peak_allocated_bytes, "peak VRAM"
    return p.peak_rss_bytes, "peak RSS"


def compare(earlier: Any, later: Any) -> Comparison:
    (s0, b0), (s1, b1) = _speed(earlier), _speed(later)
    st0, st1 = earlier.steps, later.steps
    if st0.samples_per_s and st1.samples_per_s and st0.batch_size != st1.batch_size:
        # Throughput is the fair measure across batch sizes; as a time ratio: earlier/later.
        s0, s1, b1 = 1 / st0.samples_per_s, 1 / st1.samples_per_s, "samples/s"
    elif b0 != b1:  # one has steps, the other not: compare wall time
        s0, s1, b1 = earlier.wall_s, later.wall_s, "wall time"
    (m0, c0), (m1, c1) = _memory(earlier), _memory(later)
    speed = s0 / s1 if s0 and s1 else None
    memory = m1 / m0 if m0 and m1 and c0 == c1 else None
    mfu, precisions = _mfu_pair(earlier, later)
    return Comparison(speed, b1, memory, c1, mfu, precisions)


def _mfu_pair(earlier: Any, later: Any) -> tuple[tuple[float, float] | None, tuple[str, str]]:
    a, b = getattr(earlier, "flops", None), getattr(later, "flops", None)
    if a is None or b is None or a.mfu is None or b.mfu is None or a.gpu_model != b.gpu_model:
        return None, ("", "")

    def main_precision(t: Any) -> str:
        mix = t.count.precision_mix() if t.count is not None else []
        return mix[0][0] if mix else ""

    return (a.mfu, b.mfu), (main_precision(a), main_precision(b))


class ProfileHistory:
    """The profiled cells of one kernel, oldest first (``KernelState.profile_history``)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: deque[CellProfile] = deque(maxlen=max_entries)
        self._lock = threading.Lock()

    def add(self, profile: CellProfile) -> None:
        with self._lock:
            self._entries.append(profile)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def entries(self) -> list[CellProfile]:
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[CellProfile]:
        return iter(self.entries())

