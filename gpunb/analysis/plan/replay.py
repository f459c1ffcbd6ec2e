"""A recorded dry run, replayed through the caching allocator's books: the peaks of each run, what
was alive at the peak (by role and by line) and the memory over the step, by role.

What the GPU adds that the step's own tensors do not show is added here: cuBLAS's workspace, made
at the step's first matrix product and kept by torch for the process (it is counted in
``memory_allocated``), and the allocator's rounding and segments (:mod:`allocator`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpunb.analysis.memory.alloc_records import TRACE_ROLES, AllocSite, TimelinePoint
from gpunb.analysis.memory.alloc_sites import site_of
from gpunb.analysis.memory.alloc_timeline import BACKWARD_MARK, _downsample
from gpunb.analysis.plan.allocator import AllocatorModel, Block, OutOfMemory, round_size
from gpunb.analysis.plan.recorder import BACKWARD, BEFORE, TEMPORARIES, Alloc, Recorder

Workspaces = tuple[tuple[int, ...], tuple[int, ...]]  # made by the step's thread, by autograd's device thread
WORKSPACE_SITE = -2  # an Alloc.site that is no line of the user's: cuBLAS's workspaces
BENCHMARK_SITE = -3  # ... cuDNN's benchmark-mode workspace
_ROLE_INDEX = {r: i for i, r in enumerate(TRACE_ROLES)}


@dataclass
class Replayed:
    before_bytes: int = 0  # allocated before the first step (weights, and what the user had)
    first_allocated: int = 0  # peaks of the first step (what torch's counters show after it)
    first_reserved: int = 0
    steady_allocated: int = 0  # peaks of a later step, counted from its start
    steady_reserved: int = 0
    end_allocated: int = 0
    peak_run: int = 1
    peak_index: int = 0  # the event of the peak
    peak_alloc: Alloc | None = None  # the allocation that made the peak
    at_peak: list[Alloc] = field(default_factory=list)
    by_role: dict[str, int] = field(default_factory=dict)
    points: tuple[TimelinePoint, ...] = ()
    events: int = 0

    @property
    def peak_allocated(self) -> int:
        return max(self.first_allocated, self.steady_allocated)

    @property
    def peak_reserved(self) -> int:
        return max(self.first_reserved, self.steady_reserved)


def with_workspaces(rec: Recorder, workspaces: Workspaces) -> tuple[list[tuple[bool, Alloc]], list[int]]:
    """The events with cuBLAS's workspaces put where torch makes them, and the runs' marks moved with
    them: ``workspaces[0]`` at the first run's start (the step's thread), ``workspaces[1]`` at its
    backward pass's first event (autograd's device thread has a cuBLAS handle and workspace of its own)."""
    events = list(rec.events)
    marks = list(rec.marks)
    if not marks or marks[0] >= len(events):
        return events, marks
    first = marks[0]
    end = marks[1] if len(marks) > 1 else len(events)
    backward = next((i for i in range(first, end) if events[i][1].phase == BACKWARD), None)
    inserts = [(first, workspaces[0])] + ([(backward, workspaces[1])] if backward is not None else [])
    for at, sizes in sorted(inserts, key=lambda e: -e[0]):
        for nbytes in reversed(sizes):
            events.insert(at, (True, Alloc(nbytes, WORKSPACE_SITE, BEFORE, "", "other", 1)))
            marks = [m if m <= at else m + 1 for m in marks]
    if rec.benchmark_bytes:
        events, marks = _benchmark_workspace(events, marks, rec.benchmark_bytes)
    return events, marks


def _benchmark_workspace(events: list[tuple[bool, Alloc]], marks: list[int],
                         nbytes: int) -> tuple[list[tuple[bool, Alloc]], list[int]]:
    """cuDNN's benchmark-mode workspace, held from each run's first backward event to its last."""
    bounds = [*marks, len(events)]
    out: list[tuple[bool, Alloc]] = events[: bounds[0]]
    new_marks = []
    for run, (a, b) in enumerate(itertools.pairwise(bounds), start=1):
        new_marks.append(len(out))
        chunk = events[a:b]
        back = [i for i, (_, e) in enumerate(chunk) if e.phase == BACKWARD]
        if back:
            ws = Alloc(nbytes, BENCHMARK_SITE, BACKWARD, "", TEMPORARIES, run)
            chunk = [*chunk[: back[0]], (True, ws), *chunk[back[0]: back[-1] + 1], (False, ws), *chunk[back[-1] + 1:]]
        out += chunk
    return out, new_marks


def fits_under(rec: Recorder, workspaces: Workspaces, cap_bytes: int) -> bool:
    """Whether every run of the step gets its memory under ``cap_bytes`` reserved by torch."""
    events, _ = with_workspaces(rec, workspaces)
    model = AllocatorModel(cap_bytes)
    blocks: dict[int, Block | None] = {}
    try:
        for is_alloc, alloc in events:
            if is_alloc:
                blocks[id(alloc)] = model.malloc(alloc.nbytes)
            else:
                model.free(blocks.pop(id(alloc), None))
    except OutOfMemory:
        return False
    return True


def replay(rec: Recorder, *, workspaces: Workspaces) -> Replayed:
    events, marks = with_workspaces(rec, workspaces)
    model = AllocatorModel()
    blocks: dict[int, tuple[Block | None, int]] = {}
    level = [0] * len(TRACE_ROLES)
    levels: list[tuple[int, ...]] = []
    totals: list[int] = []
    out = Replayed(events=len(events))
    run_peaks: list[tuple[int, int, int]] = []  # (allocated peak, reserved peak, event index of the peak)
    best = (-1, -1)
    run_at = 0
    for i, (is_alloc, alloc) in enumerate(events):
        if run_at < len(marks) and i == marks[run_at]:
            if run_at == 0:
                out.before_bytes = model.allocated
            else:
                run_peaks.append((model.peak_allocated, model.peak_reserved, best[1]))
            model.reset_peaks()
            best = (model.allocated, i)
            run_at += 1
        k = _ROLE_INDEX.get(alloc.role, _ROLE_INDEX["other"])
        if is_alloc:
            block = model.malloc(alloc.nbytes)
            size = block.size if block is not None else 0
            blocks[id(alloc)] = (block, size)
            level[k] += size
        else:
            entry = blocks.pop(id(alloc), None)
            if entry is not None:
                model.free(entry[0])
                level[k] -= entry[1]
        levels.append(tuple(level))
        totals.append(model.allocated)
        if run_at > 0 and model.allocated > best[0]:
            best = (model.allocated, i)
    run_peaks.append((model.peak_allocated, model.peak_reserved, best[1]))
    out.end_allocated = model.allocated
    if run_peaks:
        out.first_allocated, out.first_reserved = run_peaks[0][0], run_peaks[0][1]
        later = run_peaks[1:] or run_peaks[:1]
        out.steady_allocated = max(p[0] for p in later)
        out.steady_reserved = max(p[1] for p in later)
        peak = max(range(len(run_peaks)), key=lambda r: (run_peaks[r][0], -r))
        out.peak_run = peak + 1
        peak_i = out.peak_index = max(run_peaks[peak][2], 0)
        out.peak_alloc = events[peak_i][1] if events else None
        out.at_peak = _alive_at(events, peak_i)
        out.by_role = dict(zip(TRACE_ROLES, levels[peak_i], strict=True)) if levels else {}
        out.points = _downsample([float(j) for j in range(len(levels))], levels, totals, peak_i) if levels else ()
    return out


def _alive_at(events: list[tuple[bool, Alloc]], index: int) -> list[Alloc]:
    alive: dict[int, Alloc] = {}
    for is_alloc, alloc in events[: index + 1]:
        if is_alloc:
            alive[id(alloc)] = alloc
        else:
            alive.pop(id(alloc), None)
    return list(alive.values())


def site_label(rec: Recorder, alloc: Alloc, cell_numbers: Mapping[str, int]) -> tuple[str, tuple[str, ...]]:
    """The user's line of an allocation, as ``%%gpumem --trace`` labels it."""
    if alloc.site == WORKSPACE_SITE:
        return "cuBLAS workspaces (kept by torch for the process)", ()
    if alloc.site == BENCHMARK_SITE:
        return "cuDNN's workspace in benchmark mode (torch.backends.cudnn.benchmark)", ()
    if alloc.phase == BEFORE and alloc.site < 0:
        return f"before the step: {alloc.role}", ()
    frames = rec.sites[alloc.site] if 0 <= alloc.site < len(rec.sites) else ()
    label, stack = site_of(list(frames), cell_numbers)
    if alloc.phase == BACKWARD:
        label = BACKWARD_MARK + label
    return label, stack


def sites_at_peak(rec: Recorder, replayed: Replayed, cell_numbers: Mapping[str, int],
                  top: int = 8) -> tuple[AllocSite, ...]:
    """What was alive at the peak, by the line that made it, largest first (``%%gpumem --trace``'s sites)."""
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    stacks: dict[str, tuple[str, ...]] = {}
    roles: dict[str, dict[str, int]] = {}
    for a in replayed.at_peak:
        label, stack = site_label(rec, a, cell_numbers)
        size = round_size(a.nbytes)
        sizes[label] = sizes.get(label, 0) + size
        counts[label] = counts.get(label, 0) + 1
        stacks.setdefault(label, stack)
        by_role = roles.setdefault(label, {})
        by_role[a.role] = by_role.get(a.role, 0) + size
    sites = [AllocSite(label, n, counts[label], stacks[label], max(roles[label], key=lambda r: roles[label][r]))
             for label, n in sizes.items()]
    sites.sort(key=lambda s: -s.nbytes)
    return tuple(sites[:top])
