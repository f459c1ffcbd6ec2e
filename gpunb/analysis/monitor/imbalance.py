"""Unbalanced GPUs in the monitor's window: one idle while the others work, one holding far
more memory, or very different utilization.

With DDP every step waits for the slowest rank, so an idle GPU beside busy ones (a rank that
finished its data, a launch that left one GPU unused) or a rank holding much more memory (rank
0 evaluating or logging) costs the whole job. Judged over a window (30 s by default), never one
reading: NVML's utilization is itself a 1/6-1 s busy fraction, and DDP ranks take turns between
compute and all-reduce within a step. A GPU counts only when this kernel's processes (itself or
a rank it started) hold memory on it; where NVML cannot say whose the memory is, GPUs holding
more than a CUDA context's worth stand in, and the finding says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOW_S = 30.0  # how much history is judged
MIN_COVERED_S = 10.0  # ...and at least this much of it must be there
MIN_ROWS = 8
IDLE_PCT = 10  # at or below: idle in that reading
BUSY_PCT = 50  # at or above: working
IDLE_SHARE = 0.6  # idle while another worked in this share of the window's readings
UTIL_GAP_PCT = 35  # medians this far apart, none idle
MEMORY_RATIO = 1.5  # one holds this many times another's memory...
MEMORY_GAP_MIB = 2048.0  # ...and at least this much more
IN_USE_MIB = 1024.0  # without ownership: a GPU holding more than this is in use


@dataclass(frozen=True)
class Imbalance:
    """One finding: ``kind`` is "idle", "utilization" or "memory"; ``gpus`` the odd ones out."""

    kind: str
    gpus: tuple[int, ...]
    text: str
    seconds: float  # the span of readings judged
    detail: dict[str, Any] = field(default_factory=dict)


def _known(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _participants(gpus: Sequence[Any], rows: slice) -> tuple[list[Any], str]:
    """The GPUs this kernel's work runs on, and how they were told apart."""
    owned: list[Any] = []
    unknown = True
    for g in gpus:
        own = _known(g.columns.get("mem_own_mib", [])[rows])
        if own:
            unknown = False
            if statistics.median(own) > 0:
                owned.append(g)
    if not unknown:
        return owned, "this kernel's processes"
    in_use = [g for g in gpus if (used := _known(g.columns.get("mem_used_mib", [])[rows]))
              and statistics.median(used) > IN_USE_MIB]
    return in_use, "GPUs in use (NVML cannot say whose processes hold them here)"


def find_imbalance(t_s: Sequence[float], gpus: Sequence[Any], window_s: float = WINDOW_S) -> list[Imbalance]:
    """Findings over the last ``window_s`` of the readings (``t_s`` and each GPU's ``columns``, as
    the sampler's :class:`~gpunb.analysis.monitor.series.GpuSeries` hold them). Empty when balanced,
    when fewer than two GPUs take part, or when too little has been read yet."""
    if len(gpus) < 2 or not t_s:
        return []
    first = next((i for i, t in enumerate(t_s) if t is not None and t >= t_s[-1] - window_s), len(t_s))
    rows = slice(first, len(t_s))
    span = (t_s[-1] - t_s[first]) if first < len(t_s) else 0.0
    if span < MIN_COVERED_S or len(t_s) - first < MIN_ROWS:
        return []
    gpus, whose = _participants(gpus, rows)
    if len(gpus) < 2:
        return []
    found: list[Imbalance] = []
    util = {g.index: g.columns.get("util_pct", [])[rows] for g in gpus}
    idle_gpus = []
    for g in gpus:
        moments = [(u, [util[o.index][k] for o in gpus if o.index != g.index]) for k, u in enumerate(util[g.index])]
        judged = [(u, others) for u, others in moments if u is not None and any(o is not None for o in others)]
        if len(judged) < MIN_ROWS:
            continue
        idle = sum(1 for u, others in judged if u <= IDLE_PCT and any(o is not None and o >= BUSY_PCT for o in others))
        if idle / len(judged) >= IDLE_SHARE:
            idle_gpus.append((g.index, idle / len(judged)))
    medians: dict[int, float] = {i: statistics.median(_known(v)) for i, v in util.items() if _known(v)}
    if idle_gpus and len(idle_gpus) < len(gpus):
        ids = tuple(i for i, _ in idle_gpus)
        busy = [i for i in medians if i not in ids]
        text = (f"{_names(ids)} idle {_pct(max(s for _, s in idle_gpus))} of the last {span:.0f} s while "
                f"{_names(busy)} worked (median utilization "
                + ", ".join(f"GPU {i} {medians[i]:.0f}%" for i in sorted(medians)) + ")")
        found.append(Imbalance("idle", ids, text, span, {"median_util_pct": medians, "whose": whose}))
    elif len(medians) >= 2:
        hi = max(medians, key=lambda i: medians[i])
        lo = min(medians, key=lambda i: medians[i])
        if medians[hi] - medians[lo] >= UTIL_GAP_PCT:
            text = (f"GPU {lo} busy {medians[lo]:.0f}% vs GPU {hi} {medians[hi]:.0f}% (medians of the last "
                    f"{span:.0f} s): the ranks do unequal work")
            found.append(Imbalance("utilization", (lo,), text, span, {"median_util_pct": medians, "whose": whose}))
    memory: dict[int, float] = {}
    for g in gpus:
        own = _known(g.columns.get("mem_own_mib", [])[rows])
        values = own if own and whose == "this kernel's processes" else _known(g.columns.get("mem_used_mib", [])[rows])
        if values:
            memory[g.index] = statistics.median(values)
    if len(memory) >= 2:
        hi = max(memory, key=lambda i: memory[i])
        lo = min(memory, key=lambda i: memory[i])
        if memory[hi] >= MEMORY_RATIO * max(memory[lo], 1.0) and memory[hi] - memory[lo] >= MEMORY_GAP_MIB:
            text = (f"GPU {hi} holds {memory[hi] / max(memory[lo], 1.0):.1f}x GPU {lo}'s memory "
                    f"({memory[hi] / 1024:.1f} vs {memory[lo] / 1024:.1f} GiB, medians of the last {span:.0f} s)")
            found.append(Imbalance("memory", (hi,), text, span, {"median_mib": memory, "whose": whose}))
    return found


def _names(indices: Sequence[int]) -> str:
    indices = sorted(indices)
    return "GPU " + ", ".join(map(str, indices)) if len(indices) == 1 else "GPUs " + ", ".join(map(str, indices))


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


ADVICE = {
    "idle": "a rank that ran out of batches waits in the next all-reduce (give every rank the same number: "
            "DistributedSampler, drop_last=True), or the launch left a GPU unused (num_processes = GPUs)",
    "utilization": "per-GPU batches or sequence lengths differ, or one GPU is throttled or shared: same batch "
                   "per rank, DistributedSampler, and check the clock-event badge",
    "memory": "one rank keeps more (evaluation, logging or checkpoints on rank 0, or a different batch): "
              "do that work on every rank's share or free it after use",
}
