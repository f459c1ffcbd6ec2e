"""A traced cell, replayed: memory over time by role, the peak, and which lines made the peak.

Input: torch's snapshot (``torch.cuda.memory._snapshot()``: ``device_traces`` events and the
``segments`` alive at the end), what was allocated when the cell started, and the census
before and after the cell (storage address -> role). Allocated bytes follow torch's own
counter: an ``alloc`` adds the block's size (:func:`block_bytes`), ``free_requested`` takes it off (torch's
``allocated_bytes`` drops when the tensor is freed, before a stream's pending work lets the
block be reused: ``free_completed``); a ``free_completed`` without a request (older torch)
takes it off then. So the timeline's peak is torch's ``max_memory_allocated`` over the cell.

Roles (docs/memory-trace.md says the same to users):
- a block alive at the end whose address a census tensor starts at takes the census role
  (parameters, gradients, optimizer state; a tensor held by a variable is "other");
- a block freed by ``zero_grad`` held gradients;
- made by the optimizer (a frame in ``torch/optim/``) and outliving its step: optimizer state;
- made by the backward pass (no Python stack: autograd's device thread; or a frame of
  ``torch/autograd``) and outliving it: gradients;
- made in forward code and still alive when a backward pass ran: activations;
- everything else that was freed in the cell: temporaries; blocks from before the cell take
  the role the census gave them then, else "other".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gpunb.analysis.memory.alloc_records import TRACE_ROLES, AllocSite, TimelinePoint
from gpunb.analysis.memory.alloc_sites import BEFORE_CELL, NO_PYTHON, site_of

CENSUS_TO_TRACE = {"parameter": "parameters", "gradient": "gradients", "optimizer state": "optimizer state",
                   "other": "other"}
FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD = "forward", "backward", "optimizer", "zero_grad"
UNRECORDED = "no stack: made before the history was armed, or by a backward pass"
BACKWARD_MARK = "the backward pass of "  # before the line: no parenthesised aside
MAX_POINTS = 400  # the chart is ~600 px wide: more points than that draw nothing new
_ROLE_INDEX = {r: i for i, r in enumerate(TRACE_ROLES)}


def phase_of(frames: Sequence[Mapping[str, Any]] | None) -> str:
    """Which part of a training step an event belongs to, from its Python stack."""
    if not frames:
        return BACKWARD  # autograd's device thread has no Python frames
    for frame in frames:
        path = str(frame.get("filename", "")).replace("\\", "/")
        name = frame.get("name", "")
        if name == "zero_grad":
            return ZERO_GRAD
        if "/torch/optim/" in path:
            return OPTIMIZER
        if "/torch/autograd/" in path or (name == "backward" and path.endswith("torch/_tensor.py")):
            return BACKWARD
    return FORWARD


@dataclass
class _Block:
    addr: int
    size: int
    alloc_at: int  # event index; -1: allocated before the cell
    freed_at: int | None = None
    frames: Sequence[Mapping[str, Any]] | None = None
    freed_in: str = ""
    role: str = "other"
    in_backward: bool = False  # made by autograd's thread (frames: the line that called backward)


@dataclass(frozen=True)
class Replay:
    points: tuple[TimelinePoint, ...]
    peak_bytes: int
    peak_t: float
    peak_by_role: dict[str, int]
    sites_at_peak: tuple[AllocSite, ...]
    end_bytes: int
    events: int
    time_unit: str
    notes: tuple[str, ...]


def block_bytes(requested: int) -> int:
    """What torch's counter adds for a request: events carry the size asked for, the allocator
    hands out multiples of 512 bytes (``kMinBlockSize``, c10/cuda/CUDACachingAllocator.cpp). A large
    block it does not split (less than 1 MiB left over) counts whole: then the timeline is below
    torch's count by that remainder."""
    return max(512, -(-requested // 512) * 512) if requested > 0 else 0


def cell_events(snapshot: Mapping[str, Any], device: int, start_us: int | None = None) -> list[Mapping[str, Any]]:
    """The device's events (alloc and free), those at or after ``start_us`` when given."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if 0 <= device < len(traces) else []
    out = [e for e in events if isinstance(e, Mapping)]
    if start_us is not None:
        out = [e for e in out if not isinstance(e.get("time_us"), int) or e["time_us"] >= start_us]
    return out


def live_blocks(snapshot: Mapping[str, Any], device: int | None = None) -> list[Mapping[str, Any]]:
    """The allocated blocks of the snapshot's segments (of ``device`` when given)."""
    out = []
    for seg in snapshot.get("segments") or []:
        if not isinstance(seg, Mapping) or (device is not None and seg.get("device", device) != device):
            continue
        out += [b for b in seg.get("blocks") or [] if isinstance(b, Mapping) and b.get("state") == "active_allocated"]
    return out


def replay(snapshot: Mapping[str, Any], *, device: int, baseline_bytes: int, start_roles: Mapping[int, str],
           end_roles: Mapping[int, str], cell_numbers: Mapping[str, int], start_us: int | None = None,
           top: int = 10) -> Replay:
    """The cell's memory by role over time; ``start_roles``/``end_roles``: census roles by storage address."""
    events = cell_events(snapshot, device, start_us)
    blocks: dict[int, _Block] = {}  # live, by address
    done: list[_Block] = []
    phases: list[str] = []
    before: list[_Block] = []  # from before the cell, met when freed
    counted: list[tuple[int, _Block, int]] = []  # (event index, block, +1 alloc / -1 free)
    times: list[float] = []
    timed = bool(events) and all(isinstance(e.get("time_us"), int) for e in events)
    t0 = events[0]["time_us"] if timed else 0
    pending: set[int] = set()  # freed (requested), completion not met yet
    # autograd's device thread has no Python stack: its allocations are charged to the line that
    # called backward (the last event whose stack went through torch.autograd)
    backward_caller: list[Mapping[str, Any]] = []
    for e in events:
        action = e.get("action")
        if action not in ("alloc", "free_requested", "free_completed", "free"):
            continue
        addr, size = int(e.get("addr", 0) or 0), block_bytes(int(e.get("size", 0) or 0))
        if action == "free_completed" and addr in pending:
            pending.discard(addr)  # its bytes came off at the request
            continue
        if action == "free_requested":
            pending.add(addr)
        i = len(phases)
        phases.append(phase_of(e.get("frames")))
        times.append((e["time_us"] - t0) / 1000 if timed else float(i))
        frames = e.get("frames")
        if frames and phases[i] == BACKWARD:
            backward_caller = [f for f in frames if isinstance(f, Mapping)]
        if action == "alloc":
            block = _Block(addr, size, i, frames=frames or backward_caller or None, in_backward=not frames)
            blocks[addr] = block
            counted.append((i, block, 1))
            continue
        found = blocks.pop(addr, None)
        if found is not None:
            block = found
        else:  # made before the cell
            block = _Block(addr, size, -1, role=CENSUS_TO_TRACE.get(start_roles.get(addr, "other"), "other"))
            before.append(block)
        block.freed_at, block.freed_in = i, phases[i]
        done.append(block)
        counted.append((i, block, -1))
    runs = _runs(phases)
    backward_seen = _prefix_count(phases, BACKWARD)
    for block in [*done, *blocks.values()]:
        if block.alloc_at >= 0:
            block.role = _role(block, phases, runs, backward_seen, end_roles)
    # blocks alive through the whole cell: the snapshot's live blocks that no event of the cell made
    made = {b.addr for b in blocks.values()}
    through = [_Block(int(b.get("address", 0)), int(b.get("size", 0)), -1, frames=b.get("frames"),
                      role=CENSUS_TO_TRACE.get(end_roles.get(int(b.get("address", 0)),
                                                             start_roles.get(int(b.get("address", 0)), "other")),
                                               "other"))
               for b in live_blocks(snapshot, device) if int(b.get("address", 0)) not in made]
    start = [0] * len(TRACE_ROLES)
    for b in [*before, *through]:
        start[_ROLE_INDEX[b.role]] += b.size
    known = sum(start)
    notes = []
    if known > baseline_bytes:  # blocks of other devices or a history that began mid-cell
        notes.append(f"the blocks from before the cell add up to more than torch counted then "
                     f"({known} > {baseline_bytes} bytes); the timeline starts from torch's count")
        start = [0] * len(TRACE_ROLES)
        known = 0
    start[_ROLE_INDEX["other"]] += baseline_bytes - known
    return _series(counted, times, start, cell_numbers, top, len(phases),
                   "ms" if timed else "event", notes)


def _runs(phases: list[str]) -> list[int]:
    """Run number of each event: it changes where the phase changes (forward -> backward -> optimizer)."""
    out, run = [], 0
    for i, p in enumerate(phases):
        if i and p != phases[i - 1]:
            run += 1
        out.append(run)
    return out


def _prefix_count(phases: list[str], phase: str) -> list[int]:
    out, n = [0], 0
    for p in phases:
        n += p == phase
        out.append(n)
    return out


def _role(b: _Block, phases: list[str], runs: list[int], backward_seen: list[int], end_roles: Mapping[int, str]) -> str:
    if b.freed_at is None and b.addr in end_roles:
        return CENSUS_TO_TRACE.get(end_roles[b.addr], "other")
    if b.freed_in == ZERO_GRAD:
        return "gradients"
    made_in = phases[b.alloc_at]
    same_run = b.freed_at is not None and runs[b.freed_at] == runs[b.alloc_at]
    if made_in == OPTIMIZER:
        return "temporaries" if same_run else "optimizer state"
    if made_in == BACKWARD:
        return "temporaries" if same_run else "gradients"
    until = b.freed_at if b.freed_at is not None else len(phases)
    if backward_seen[until] - backward_seen[b.alloc_at + 1] > 0:
        return "activations"
    return "temporaries" if b.freed_at is not None else "other"


def _series(counted: list[tuple[int, _Block, int]], times: list[float], start: list[int],
            cell_numbers: Mapping[str, int], top: int, n_events: int, unit: str, notes: list[str]) -> Replay:
    level = list(start)
    totals: list[int] = []
    levels: list[tuple[int, ...]] = []
    k = 0
    for i in range(n_events):
        while k < len(counted) and counted[k][0] == i:
            _, block, sign = counted[k]
            level[_ROLE_INDEX[block.role]] += sign * block.size
            k += 1
        levels.append(tuple(level))
        totals.append(sum(level))
    if not totals:
        return Replay((), sum(start), 0.0, dict(zip(TRACE_ROLES, start, strict=True)), (), sum(start), 0, unit,
                      tuple(notes))
    peak_i = max(range(len(totals)), key=totals.__getitem__)  # the first maximum
    # alive at the peak: made at or before it, freed after it (or never); older blocks not yet freed
    alive = [b for _, b, sign in counted if sign > 0 and b.alloc_at <= peak_i
             and (b.freed_at is None or b.freed_at > peak_i)]
    sites = _group_sites(alive, cell_numbers)
    untraced = totals[peak_i] - sum(b.size for b in alive)  # what blocks from before the cell held then
    if untraced > 0:
        sites.append(AllocSite(BEFORE_CELL, untraced, 0, (), ""))
    sites.sort(key=lambda s: -s.nbytes)
    points = (TimelinePoint(times[0], tuple(start)), *_downsample(times, levels, totals, peak_i))  # from the baseline
    return Replay(points, totals[peak_i], times[peak_i], dict(zip(TRACE_ROLES, levels[peak_i], strict=True)),
                  tuple(sites[:top]), totals[-1], n_events, unit, tuple(notes))


def _group_sites(alive: list[_Block], cell_numbers: Mapping[str, int]) -> list[AllocSite]:
    groups: dict[str, list[Any]] = {}
    for b in alive:
        label, stack = site_of(b.frames, cell_numbers)
        if b.in_backward and b.frames:
            label = BACKWARD_MARK + label
        g = groups.setdefault(label, [0, 0, stack, {}])
        g[0] += b.size
        g[1] += 1
        g[3][b.role] = g[3].get(b.role, 0) + b.size
    return [AllocSite(label, n, count, stack, max(roles, key=roles.get) if roles else "")
            for label, (n, count, stack, roles) in groups.items()]


def _downsample(times: list[float], levels: list[tuple[int, ...]], totals: list[int],
                peak_i: int) -> tuple[TimelinePoint, ...]:
    """At most MAX_POINTS points: in each bucket the highest one (so the peak is always drawn)."""
    n = len(levels)
    if n <= MAX_POINTS:
        keep: list[int] = list(range(n))
    else:
        edges = [round(j * n / MAX_POINTS) for j in range(MAX_POINTS + 1)]
        keep = sorted({max(range(a, b), key=totals.__getitem__) for a, b in pairwise(edges)
                       if b > a} | {0, n - 1, peak_i})
    return tuple(TimelinePoint(times[i], levels[i]) for i in keep)


def sites_of_blocks(blocks: Sequence[Mapping[str, Any]], cell_numbers: Mapping[str, int],
                    top: int = 5) -> tuple[AllocSite, ...]:
    """Live blocks (of a snapshot's segments) grouped by the line that allocated them, largest first."""
    alive = [_Block(int(b.get("address", 0)), int(b.get("size", 0)), 0, frames=b.get("frames")) for b in blocks]
    groups = _group_sites(alive, cell_numbers)
    groups = [AllocSite(UNRECORDED, g.nbytes, g.blocks) if g.label == NO_PYTHON else g for g in groups]
    return tuple(sorted(groups, key=lambda s: -s.nbytes)[:top])
