"""The verdict on a cell whose training ran in worker processes (the ranks that
``ranks/summary.py`` put side by side), and what to change.

With DDP every step ends in an all-reduce that waits for the last rank, so the slowest rank
sets the pace of all. Communication vs compute is DDP's own timing (``ranks/recorder.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpunb.analysis.advice import Advice
from gpunb.analysis.profile.records import Verdict
from gpunb.analysis.ranks.records import RanksPart, RankStats
from gpunb.analysis.ranks.summary import MIN_WAIT_MS, NAME_SHARE

SLOWER_SHARE = 0.10  # from here it gets advice
COMM_SHARE = 0.20  # all-reduce time not hidden behind the backward, as a share of the step
DATA_SHARE = 0.20
MEMORY_RATIO = 1.25
MEMORY_GAP_BYTES = 2**30
DDP_DOC = "https://pytorch.org/docs/stable/notes/ddp.html"


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
            # the gain is of the loop, as the other advice's: the step is the part of the loop the rank
            # did not spend waiting for data (a share of the step beside a share of the loop read 137 %)
            advice.append(Advice(title, measured, how, gain=share * (1 - min(1.0, r.data_share or 0.0)),
                                 link=DDP_DOC))
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
    if all(r.device is None for r in ranks):  # gloo on CPU processes: no GPU took part, say so
        return Verdict("multi-process", f"{head.replace(' trained', ' trained on the CPU', 1)}", reason), advice
    return Verdict("multi-gpu", head, reason), advice


def _ddp_step_ms(r: RankStats, exposed: float) -> float | None:
    """The step DDP timed in the same sampled iterations as its all-reduce (forward, backward
    compute, the all-reduce not hidden): the share's denominator. The rank's median step is
    of other iterations (the sampled ones are the early, slower ones), so a share of it could
    read 94 % beside a 14 % data wait; else the median step."""
    d = r.ddp
    if d is not None and d.forward_ms is not None and d.backward_compute_ms is not None:
        return d.forward_ms + d.backward_compute_ms + exposed
    return r.median_ms


def _comm(ranks: Sequence[RankStats], slowest: int | None) -> tuple[RankStats, float, float] | None:
    """(rank, exposed all-reduce ms, share of its step) of the rank the others wait for: its
    all-reduce is communication only, a faster rank's also holds its wait."""
    timed = {id(r): (r, exposed, step) for r in ranks
             if r.ddp is not None and (exposed := r.ddp.exposed_comm_ms) is not None
             and (step := _ddp_step_ms(r, exposed))}
    if not timed:
        return None
    chosen = timed.get(id(ranks[slowest])) if slowest is not None else None
    r, exposed, step = chosen or min(timed.values(), key=lambda t: t[1] / t[2])
    return r, exposed, min(1.0, exposed / step)
