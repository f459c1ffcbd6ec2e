"""Profiled cells of this kernel, in order, and how a cell compares with its own earlier run.

Entries are ``%%gpuprofile`` cells (``CellProfile``) and the cells measured by the one-line
mode ``%gpuprofile on`` (``CellLine``). A comparison reads like a lab note and names what it
compared: "median step 1.8x faster, peak VRAM 35% less". Speed compares
samples/s when both runs know their batch size and it differs (a larger batch takes longer
per step but may train faster), else the median step time when both runs have steps, else
the wall time; memory compares torch's peak allocated bytes when both ran on a GPU, else
the peak resident memory. When both counted their FLOPs on the same GPU model, the MFU
(datasheet basis) of each is named too: "MFU from 21% to 48%". When both measured their
energy, the energy per sample (else per step, at the same batch size) is compared:
"−38% energy per sample".

By default a cell is only compared with an earlier run of the same cell: the same ``--label``
given by the user, or the same code. Two different cells have no ratio unasked (a one-line
evaluation against a 24 s training cell said "wall time 290.4x faster", which meant nothing).
Variants the user names are compared when asked (``%gpuprofile history --vs fp32``): every other
profiled cell against the latest run labelled so, like for like (time per sample when both know
their batch size, else time per step at one batch size, else the wall time of cells without
steps), in one sentence: "bf16 took 0.19× the time per step of fp32" (:func:`variant_sentence`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 500  # a day of profiling; each entry is a few KB


@dataclass(frozen=True)
class RunOf:
    """Which cell an entry is a run of: the user's own label (``--label``; "" when it is the
    default, the first line of code) and the cell's code (None when not known: the API)."""

    label: str = ""
    code: str | None = None

    @staticmethod
    def of(*, label: str = "", code: str | None = None) -> RunOf:
        if code is not None:  # trailing spaces and blank lines at the ends do not make another cell
            code = "\n".join(line.rstrip() for line in code.strip().splitlines())
        return RunOf(label.strip(), code)

    def same_cell(self, other: RunOf) -> bool:
        return bool(self.label and self.label == other.label) or (self.code is not None and self.code == other.code)


@dataclass(frozen=True)
class Comparison:
    speedup: float | None  # > 1: the later run is faster
    speed_basis: str  # "samples/s" | "median step" | "wall time"
    memory_ratio: float | None  # later / earlier
    memory_basis: str  # "peak VRAM" | "peak RSS"
    mfu: tuple[float, float] | None = None  # (earlier, later), each against its own precision's datasheet peak
    mfu_precisions: tuple[str, str] = ("", "")  # the precision most FLOPs ran in, earlier and later
    energy_ratio: float | None = None  # later / earlier, per sample (or per step)
    energy_basis: str = ""  # "energy per sample" | "energy per step"

    def words(self) -> str:
        """What changed, naming what was compared: "median step 1.3x faster, peak VRAM 35% less"."""
        parts = []
        if self.speedup is not None:
            basis = self.speed_basis
            if abs(self.speedup - 1) < 0.03:
                parts.append(f"{basis}: same")
            elif basis == "samples/s":  # a rate: higher is faster
                ratio = self.speedup if self.speedup > 1 else 1 / self.speedup
                parts.append(f"samples/s {ratio:.1f}x {'higher' if self.speedup > 1 else 'lower'}")
            elif self.speedup > 1:
                parts.append(f"{basis} {self.speedup:.1f}x faster")
            else:
                parts.append(f"{basis} {1 / self.speedup:.1f}x slower")
        if self.memory_ratio is not None:
            change = 1 - self.memory_ratio
            if abs(change) < 0.03:
                parts.append(f"{self.memory_basis}: same")
            elif change > 0:
                parts.append(f"{self.memory_basis} {100 * change:.0f}% less")
            else:
                parts.append(f"{self.memory_basis} {100 * -change:.0f}% more")
        if self.mfu is not None:
            (before, after), (p0, p1) = (round(100 * x) for x in self.mfu), self.mfu_precisions
            if p0 != p1:  # each MFU is against its own precision's peak: say which
                parts.append(f"MFU from {before}% ({p0}) to {after}% ({p1})")
            else:
                parts.append(f"MFU {before}%" if before == after else f"MFU from {before}% to {after}%")
        if self.energy_ratio is not None:
            change = self.energy_ratio - 1
            parts.append(f"{self.energy_basis}: same" if abs(change) < 0.03 else
                         f"{'−' if change < 0 else '+'}{100 * abs(change):.0f}% {self.energy_basis}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Measures:
    """What the history compares, from a profiled cell (``CellProfile``) or a cell of the
    one-line mode (``CellLine``, which times no steps)."""

    wall_s: float
    median_step_ms: float | None
    samples_per_s: float | None
    batch_size: int | None
    peak_vram_bytes: int | None
    peak_rss_bytes: int | None


def measures(entry: Any) -> Measures:
    steps = getattr(entry, "steps", None)
    gpu = getattr(entry, "gpu", None)
    if steps is None:  # a one-line cell
        return Measures(entry.wall_s, None, None, None, entry.peak_vram_bytes, entry.peak_rss_bytes)
    return Measures(entry.wall_s, steps.median_ms, steps.samples_per_s, steps.batch_size,
                    gpu.peak_allocated_bytes if gpu is not None else None, entry.peak_rss_bytes)


def _speed(m: Measures) -> tuple[float | None, str]:
    if m.median_step_ms:
        return m.median_step_ms, "median step"
    return m.wall_s, "wall time"


def _memory(m: Measures) -> tuple[float | None, str]:
    if m.peak_vram_bytes:
        return m.peak_vram_bytes, "peak VRAM"
    return m.peak_rss_bytes, "peak RSS"


def compare(earlier: Any, later: Any) -> Comparison:
    """How ``later`` did against ``earlier`` (profiled cells or one-line cells)."""
    e0, e1 = measures(earlier), measures(later)
    (s0, b0), (s1, b1) = _speed(e0), _speed(e1)
    if e0.samples_per_s and e1.samples_per_s and e0.batch_size != e1.batch_size:
        # Throughput is the fair measure across batch sizes; as a time ratio: earlier/later.
        s0, s1, b1 = 1 / e0.samples_per_s, 1 / e1.samples_per_s, "samples/s"
    elif b0 != b1:  # one has steps, the other not: compare wall time
        s0, s1, b1 = e0.wall_s, e1.wall_s, "wall time"
    (m0, c0), (m1, c1) = _memory(e0), _memory(e1)
    speed = s0 / s1 if s0 and s1 else None
    memory = m1 / m0 if m0 and m1 and c0 == c1 else None
    mfu, precisions = _mfu_pair(earlier, later)
    return Comparison(speed, b1, memory, c1, mfu, precisions, *_energy_pair(earlier, later))


def like_for_like(earlier: Any, later: Any) -> tuple[float, float, str] | None:
    """(earlier's, later's time, what it is per) for two variants: "sample" when both know their
    samples/s (batch sizes may differ), "step" when both timed steps at one batch size (or both
    unknown), "cell" (wall time) when neither has steps; None when they are not alike (steps of
    different or half-known batch sizes, or one cell with steps and one without)."""
    e0, e1 = measures(earlier), measures(later)
    if e0.samples_per_s and e1.samples_per_s:
        return 1 / e0.samples_per_s, 1 / e1.samples_per_s, "sample"
    if e0.median_step_ms and e1.median_step_ms:
        return (e0.median_step_ms, e1.median_step_ms, "step") if e0.batch_size == e1.batch_size else None
    if e0.median_step_ms is None and e1.median_step_ms is None and e0.wall_s and e1.wall_s:
        return e0.wall_s, e1.wall_s, "cell"
    return None


def _name(entry: Any, index: int) -> str:
    label = getattr(entry, "label", "") or ""
    return f'"{label}"' if label else f"#{index + 1}"


def variant_sentence(earlier: Any, later: Any, earlier_index: int, later_index: int) -> str:
    """One sentence: '"bf16" took 0.19× the time per step of "fp32".' (or why there is no ratio)."""
    a, b = _name(earlier, earlier_index), _name(later, later_index)
    alike = like_for_like(earlier, later)
    if alike is None:
        return f"{b} and {a} are not alike: steps at different or unknown batch sizes, or one without steps."
    t0, t1, per = alike
    what = "wall time" if per == "cell" else f"time per {per}"
    ratio = t1 / t0
    digits = 2 if ratio < 10 else 1
    return f"{b} took {ratio:.{digits}f}× the {what} of {a}."


def _energy_pair(earlier: Any, later: Any) -> tuple[float | None, str]:
    """(later / earlier, what was compared): joules per sample when both know it, else per
    step when both ran the same batch size; (None, "") when either measured no energy."""
    a, b = getattr(earlier, "energy", None), getattr(later, "energy", None)
    if a is None or b is None:
        return None, ""
    if a.sample_joules and b.sample_joules:
        return b.sample_joules / a.sample_joules, "energy per sample"
    if a.step_joules and b.step_joules and a.batch_size == b.batch_size:
        return b.step_joules / a.step_joules, "energy per step"
    return None, ""


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
        self._entries: deque[tuple[Any, RunOf]] = deque(maxlen=max_entries)  # (CellProfile or CellLine, its cell)
        self._lock = threading.Lock()

    def add(self, profile: Any, run_of: RunOf | None = None) -> None:
        """Append a profiled cell; ``run_of`` says which cell it is a run of (without it,
        the entry is compared with nothing)."""
        with self._lock:
            self._entries.append((profile, run_of or RunOf()))

    def take_from(self, other: ProfileHistory) -> None:
        """Move ``other``'s entries here, keeping which cell each is a run of."""
        with other._lock:
            moved = list(other._entries)
            other._entries.clear()
        with self._lock:
            self._entries.extend(moved)

    def baselines(self) -> tuple[int | None, ...]:
        """For each entry, the index of the latest earlier run of the same cell (None: none)."""
        with self._lock:
            runs = [run for _, run in self._entries]
        out: list[int | None] = []
        for i, run in enumerate(runs):
            out.append(next((j for j in range(i - 1, -1, -1) if run.same_cell(runs[j])), None))
        return tuple(out)

    def baselines_vs(self, label: str) -> tuple[int | None, ...] | None:
        """For each entry, the index of the latest run labelled ``label`` (None for that run
        itself); None when no run has that label."""
        with self._lock:
            labels = [run.label or getattr(entry, "label", "") for entry, run in self._entries]
        named = [i for i, x in enumerate(labels) if x == label.strip()]
        if not named:
            return None
        base = named[-1]
        return tuple(None if i == base else base for i in range(len(labels)))

    def labels(self) -> list[str]:
        with self._lock:
            return [run.label or getattr(entry, "label", "") for entry, run in self._entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def entries(self) -> list[Any]:
        with self._lock:
            return [entry for entry, _ in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.entries())

