"""What the worker processes of a profiled multi-GPU cell say together: per-rank step times
and memory, the slowest rank, communication against compute. The verdict on them is ``profile/rank_verdict.py``.

With DDP every step ends in an all-reduce that waits for the last rank, so the slowest rank
sets the pace of all: the report names it and by how much it is slower. Communication vs
compute is DDP's own timing (``rank_recorder.py``): the all-reduce's time beyond what overlapped
with the backward pass is what communication adds to each step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gpunb.analysis.ranks.records import DdpTiming, RanksPart, RankStats
from gpunb.readings.links import LinkMap, read_link_map, read_nvlink_traffic
from gpunb.readings.nvml import NvmlSession

NAME_SHARE = 0.05  # a rank this much slower than the fastest is named the slowest...
MIN_WAIT_MS = 1.0  # ...and, under DDP, the others wait at least this long for it (below: timing noise)


def _percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _ddp(raw: Any) -> DdpTiming | None:
    if not isinstance(raw, dict) or not raw.get("iteration"):
        return None
    return DdpTiming(int(raw["iteration"]), raw.get("forward_ms"), raw.get("backward_compute_ms"),
                     raw.get("backward_comm_ms"), raw.get("overlap_ms"), tuple(raw.get("iterations") or ()))


def rank_stats(record: dict[str, Any], warmup_steps: int = 1, nvml_index: int | None = None) -> RankStats:
    """One worker's record (``rank_recorder.RankRecorder.record``) as numbers to compare."""
    times = [float(x) for x in record.get("step_ms") or []]
    skip = max(0, warmup_steps - int(record.get("step_ms_offset") or 0))
    steady = times[skip:] if len(times) > skip else []
    first_batch, last_step = record.get("first_batch_s"), record.get("last_step_s")
    loop = (last_step - (first_batch or 0.0)) if last_step is not None else None
    gpu = record.get("gpu") or {}
    return RankStats(
        rank=record.get("rank"), pid=int(record.get("pid") or 0), launcher=str(record.get("launcher") or ""),
        device=record.get("device"), nvml_index=gpu.get("nvml_index", nvml_index),
        gpu_name=str(gpu.get("name") or ("CPU" if record.get("device") is None else "")),
        steps=int(record.get("steps") or 0), first_ms=record.get("first_step_ms"),
        median_ms=statistics.median(steady) if steady else None,
        p90_ms=_percentile(steady, 0.9) if steady else None, source=str(record.get("source") or ""),
        data_wait_s=float(record.get("data_wait_s") or 0.0), batches=int(record.get("batches") or 0),
        batch_size=record.get("batch_size"), loop_s=loop if loop and loop > 0 else None,
        peak_allocated_bytes=record.get("peak_allocated_bytes"), peak_reserved_bytes=record.get("peak_reserved_bytes"),
        nvml_peak_bytes=record.get("nvml_peak_bytes"), total_bytes=gpu.get("total_bytes"),
        ddp=_ddp(record.get("ddp")), backend=record.get("backend"), finished=bool(record.get("final")),
    )


def _link_words(links: LinkMap | None, indices: Sequence[int]) -> tuple[str, bool]:
    if links is None or len(indices) < 2:
        return "", False
    pairs = [p for i, a in enumerate(indices) for b in indices[i + 1:] if (p := links.pair(a, b)) is not None]
    if not pairs:
        return "", False
    weakest = min(pairs, key=lambda p: (p.nvlinks, p.nvlink_gbps or 0.0))
    if weakest.nvlinks:
        via = " through NVSwitch" if weakest.via_switch else ""
        return f"NVLink × {weakest.nvlinks}{via}" + (f", {weakest.nvlink_gbps:.0f} GB/s per direction"
                                                     if weakest.nvlink_gbps else ""), False
    peer = "peer access ok" if weakest.p2p_ok("read") else f"peer access {weakest.p2p_words('read')}"
    return f"PCIe ({weakest.topology_name}), {peer}", True


class TrafficMeter:
    """NVLink bytes each GPU moved during the cell, from NVML's running counters (read at the
    cell's start and end; None where NVML does not count them).

    The start is read in the background, so a cell does not wait for it (a few NVML field
    reads per GPU); a worker's traffic in the first milliseconds may fall before it. The end
    is read only when workers reported (``moved``)."""

    def __init__(self, nvml: NvmlSession) -> None:
        self.nvml = nvml
        self._start = nvml.run_soon(_read_all_traffic, nvml, fallback=lambda _why: {}, what="the NVLink counters")

    @property
    def start(self) -> dict[int, tuple[int, int] | None]:
        return self._start.result()

    def moved(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for i, before in self.start.items():
            after = read_nvlink_traffic(self.nvml, i) if before is not None else None
            if before is not None and after is not None:
                out[i] = max(0, (after[0] - before[0]) + (after[1] - before[1]))
        return out


def _read_all_traffic(nvml: NvmlSession) -> dict[int, tuple[int, int] | None]:
    count = nvml.device_count()
    return {i: read_nvlink_traffic(nvml, i) for i in range(count)} if count > 1 else {}


def build_ranks(records: Sequence[dict[str, Any]], *, warmup_steps: int = 1, nvml: NvmlSession | None = None,
                traffic: dict[int, int] | None = None, notes: Sequence[str] = ()) -> RanksPart | None:
    """The ranks of one cell from their records; None when no worker took a step. ``notes``:
    what the channel left out (``channel.read_records``), shown with the ranks."""
    ranks = [rank_stats(r, warmup_steps) for r in records if r.get("steps")]
    if not ranks:
        return None
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid))
    slowest, fastest, spread, by, wait = _slowest(ranks)
    balanced = spread is None or spread < NAME_SHARE or (wait is not None and wait < MIN_WAIT_MS)
    worlds = {r.get("world_size") for r in records if r.get("world_size")}
    links = None
    gpus = sorted({r.nvml_index for r in ranks if r.nvml_index is not None})
    if nvml is not None and len(gpus) > 1:
        from gpunb.readings.gpu import read_info

        links = read_link_map(nvml, [read_info(nvml, i) for i in gpus])
    link, pcie = _link_words(links, gpus)
    notes = list(notes)
    unfinished = [r.name for r in ranks if not r.finished]
    if unfinished:
        notes.append(f"{', '.join(unfinished)} had not exited when the cell ended (still running, or killed): "
                     "their figures stop at their last record (written every 2 s)")
    return RanksPart(tuple(ranks), worlds.pop() if len(worlds) == 1 else None, slowest, fastest, spread, by, wait,
                     balanced, link, pcie, {i: b for i, b in (traffic or {}).items() if i in gpus}, tuple(notes))


def _slowest(ranks: Sequence[RankStats]) -> tuple[int | None, int | None, float | None, str, float | None]:
    """(slowest, fastest, spread, by what, wait ms). Under DDP every step ends in an all-reduce
    that no rank leaves before the last one arrives, so step times come out alike; the rank
    the others wait for is the one whose all-reduce took least (DDP's timing of the same
    iteration), and the others' extra all-reduce time is their wait. Without DDP's timing the
    ranks' median steps are compared."""
    timings = {i: r.ddp for i, r in enumerate(ranks) if r.ddp is not None}
    comm = {i: ms for i, t in timings.items() if (ms := t.backward_comm_ms) is not None}
    if len(comm) > 1 and len({timings[i].iterations for i in comm}) == 1:
        slow = min(comm, key=lambda i: comm[i])
        fast = max(comm, key=lambda i: comm[i])
        wait = comm[fast] - comm[slow]
        step = ranks[slow].median_ms
        return slow, fast, (wait / step if step else None), "all-reduce wait", wait
    medians = {i: ms for i, r in enumerate(ranks) if (ms := r.median_ms)}
    if len(medians) < 2:
        return None, None, None, "", None
    slow = max(medians, key=lambda i: medians[i])
    fast = min(medians, key=lambda i: medians[i])
    return slow, fast, medians[slow] / medians[fast] - 1.0, "median step", None
