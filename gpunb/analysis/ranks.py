"""What the worker processes of a profiled multi-GPU cell say together: per-rank step times
and memory, the slowest rank, communication against compute, and advice.

With DDP every step ends in an all-reduce that waits for the last rank, so the slowest rank
sets the pace of all: the report names it and by how much it is slower. Communication vs
compute is DDP's own timing (``rank_recorder.py``): the all-reduce's time beyond what overlapped
with the backward pass is what communication adds to each step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gpunb.analysis.advice import Advice
from gpunb.analysis.profile_records import Verdict
from gpunb.analysis.rank_records import DdpTiming, RanksPart, RankStats
from gpunb.readings.links import LinkMap, read_link_map, read_nvlink_traffic
from gpunb.readings.nvml import NvmlSession

NAME_SHARE = 0.05  # a rank this much slower than the fastest is named the slowest...
MIN_WAIT_MS = 1.0  # ...and, under DDP, the others wait at least this long for it (below: timing noise)
SLOWER_SHARE = 0.10  # from here it gets advice
COMM_SHARE = 0.20  # all-reduce time not hidden behind the backward, as a share of the step
DATA_SHARE = 0.20
MEMORY_RATIO = 1.25
MEMORY_GAP_BYTES = 2**30
DDP_DOC = "https://pytorch.org/docs/stable/notes/ddp.html"


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
                traffic: dict[int, int] | None = None) -> RanksPart | None:
    """The ranks of one cell from their records; None when no worker took a step."""
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
    notes = []
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


def judge_ranks(part: RanksPart) -> tuple[Verdict, list[Advice]]:
    """The verdict on a cell whose training ran in worker processes, and what to change."""
    ranks = part.ranks
    advice: list[Advice] = []
    n = len(ranks)
    finished = [r for r in ranks if r.finished]
    counts = {r.steps for r in finished}
    if len(finished) > 1 and len(counts) > 1:
        listing = ", ".join(f"{r.name}: {r.steps}" for r in finished)
        advice.append(Advice("Give every rank the same number of batches",
                             f"the ranks took different numbers of optimizer steps ({listing}); with DDP a rank that "
                             "runs out of data leaves the others waiting in an all-reduce, which hangs the job",
                             "DistributedSampler(dataset, drop_last=True) for every rank's loader, or "
                             "`with model.join():` around the loop for uneven inputs", severity=2, link=DDP_DOC))
    sizes = {r.batch_size for r in ranks if r.batch_size}
    if len(sizes) > 1:
        listing = ", ".join(f"{r.name}: {r.batch_size}" for r in ranks if r.batch_size)
        advice.append(Advice("Use the same per-GPU batch size on every rank",
                             f"batch sizes differ ({listing}): every step waits for the rank with the largest",
                             "one DataLoader(batch_size=B, sampler=DistributedSampler(...)) per rank"))
    if (not part.balanced and part.spread is not None and part.spread >= SLOWER_SHARE
            and part.slowest is not None and part.fastest is not None):
        slow, fast = ranks[part.slowest], ranks[part.fastest]
        where = f" on GPU {slow.nvml_index}" if slow.nvml_index is not None else ""
        if part.slowest_by == "all-reduce wait":
            why = (f"at each all-reduce the other ranks wait for {slow.name}{where}: "
                   f"{fast.name} waited {part.wait_ms or 0.0:.2f} ms more than it ({part.spread:.0%} of a step; "
                   f"DDP's timing of {slow.ddp.sampled if slow.ddp is not None else 'its iterations'})")
        else:
            why = (f"{slow.name}{where} takes {slow.median_ms:.2f} ms per step (median), {part.spread:.0%} more "
                   f"than {fast.name}'s {fast.median_ms:.2f} ms")
        advice.append(Advice(f"Find out why {slow.name} is slower", why,
                             "same batch size and data per rank (DistributedSampler); the same GPU model; no other "
                             "process on that GPU; %gpumonitor's clock-event badge for throttling",
                             gain=min(part.spread, 0.9)))
    for r in ranks:
        share = r.data_share
        if share is not None and share >= DATA_SHARE:
            advice.append(Advice(f"Feed {r.name} faster",
                                 f"{r.name} waited {r.data_wait_s:.2f} s ({share:.0%} of its loop) "
                                 f"for {r.batches} batches",
                                 "DataLoader(..., num_workers=k, pin_memory=True, persistent_workers=True) per rank; "
                                 "cores per rank = CPU cores / ranks", gain=share))
            break
    comm = _comm(ranks, part.slowest)
    if comm is not None and comm[0].ddp is not None:
        r, exposed, share = comm
        timing = comm[0].ddp
        measured = (f"DDP's timing of {timing.sampled} on {r.name} (the rank the others wait for, so its "
                    f"all-reduce is communication only): {timing.backward_comm_ms or 0.0:.2f} ms, "
                    f"{exposed:.2f} ms of it not hidden behind the backward pass ({share:.0%} of the step)")
        if share >= COMM_SHARE:
            if part.link_is_pcie:
                how = ("gradient accumulation with `with model.no_sync():` on all but every k-th batch; bf16 gradients "
                       "(`model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
                       ".bf16_compress_hook)`); or GPUs joined by NVLink")
                title = f"Sync gradients less often: they cross {part.link}"
            else:
                how = ("a larger per-GPU batch (fewer all-reduces per sample); DDP(..., bucket_cap_mb=100) so buckets "
                       "start earlier; gradient accumulation with `model.no_sync()`")
                title = "Hide more of the gradient all-reduce"
            advice.append(Advice(title, measured, how, gain=share, link=DDP_DOC))
    mems = [(r, r.peak_allocated_bytes) for r in ranks if r.peak_allocated_bytes]
    if len(mems) > 1:
        hi = max(mems, key=lambda m: m[1])
        lo = min(mems, key=lambda m: m[1])
        if hi[1] >= MEMORY_RATIO * lo[1] and hi[1] - lo[1] >= MEMORY_GAP_BYTES:
            advice.append(Advice(f"Even out memory: {hi[0].name} holds more",
                                 f"peak allocated {hi[1] / 2**30:.1f} GiB on {hi[0].name} "
                                 f"vs {lo[1] / 2**30:.1f} GiB on {lo[0].name}: "
                                 "the largest batch that fits is set by the fullest GPU",
                                 "evaluate, log and checkpoint on every rank's share (or free it after); the same "
                                 "batch per rank", severity=0))

    if part.slowest is not None and not part.balanced:
        slow = ranks[part.slowest]
        spread = part.spread or 0.0
        head = f"{n} ranks trained, {slow.median_ms or 0.0:.2f} ms per step; the slowest: {slow.name}"
        if part.slowest_by == "all-reduce wait":
            reason = (f"the other ranks wait {part.wait_ms or 0.0:.2f} ms for it at each all-reduce "
                      f"({spread:.0%} of a step)")
        else:
            faster = ranks[part.fastest].name if part.fastest is not None else "the others"
            reason = f"{spread:.0%} slower than {faster}"
    elif part.slowest is not None:
        head = f"{n} ranks trained, {ranks[part.slowest].median_ms:.2f} ms per step"
        reason = "the ranks keep the same pace (" + (
            f"under {MIN_WAIT_MS:g} ms of all-reduce wait" if part.slowest_by == "all-reduce wait"
            else f"median steps within {NAME_SHARE:.0%}") + ")"
    else:
        head = f"{n} worker process{'es' if n > 1 else ''} trained"
        reason = "one rank's steps measured" if n == 1 else "no step times to compare"
    if comm is not None:
        reason += f"; communication not hidden by compute: {comm[2]:.0%} of {comm[0].name}'s step (DDP's timing)"
    return Verdict("multi-gpu", head, reason), advice


def _comm(ranks: Sequence[RankStats], slowest: int | None) -> tuple[RankStats, float, float] | None:
    """(rank, exposed all-reduce ms, share of its median step) of the rank the others wait
    for: its all-reduce is communication only, a faster rank's also holds its wait."""
    timed = {id(r): (r, exposed, step) for r in ranks
             if r.ddp is not None and (exposed := r.ddp.exposed_comm_ms) is not None and (step := r.median_ms)}
    if not timed:
        return None
    chosen = timed.get(id(ranks[slowest])) if slowest is not None else None
    r, exposed, step = chosen or min(timed.values(), key=lambda t: t[1] / t[2])
    return r, exposed, min(1.0, exposed / step)
