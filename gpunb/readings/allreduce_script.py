"""One rank of the all-reduce measurement, run as its own process by ``gpunb.readings.allreduce``.

Each rank is a fresh interpreter with its own GPU (``cuda:<rank>``), so the notebook kernel
never gets a CUDA context and a hang or crash here cannot reach it. Imports nothing from gpunb.

Measured as nccl-tests measures ``all_reduce_perf``: warm-up calls, then ``iters`` calls back to
back timed together (CUDA events on the calling stream; the host clock for gloo), then the
bus bandwidth ``busbw = algbw * 2 (n - 1) / n`` with ``algbw = bytes / time``; and the result
checked element by element (every rank sums a pattern whose total it knows).

Protocol: one JSON object per line on stdout, flushed at once:
  {"event": "step", "step": "..."}                 where this rank is (the runner names a hang's place)
  {"event": "ready"}                               torch imported; waiting for "go" on stdin
  {"event": "init", "ms": ..., "backend": ..., "nccl_version": ...}
  {"event": "result", "bytes": ..., "ms": ..., "algbw_gbs": ..., "busbw_gbs": ..., "wrong": ...}   rank 0
  {"event": "error", "step": "...", "error": "..."}
  {"event": "done"}
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import sys
import time
from typing import Any

PATTERN = 251  # element k of rank r holds (k % 251) + r + 1: a shifted or lost chunk shows up


def emit(**obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="init_method, a file:// rendezvous")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--sizes", default="8,64,256,1024", help="MiB, comma-separated")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for init and each collective")
    return ap.parse_args(argv)


def pattern(torch: Any, n: int, rank: int, device: Any) -> Any:
    return torch.arange(n, device=device, dtype=torch.int32).remainder_(PATTERN).to(torch.float32).add_(rank + 1)


def measure(torch: Any, dist: Any, args: argparse.Namespace, device: Any, cuda: bool, n_bytes: int) -> dict[str, Any]:
    n = n_bytes // 4
    x = pattern(torch, n, args.rank, device)
    for _ in range(args.warmup):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / args.iters
    else:
        t = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        ms = (time.perf_counter() - t) * 1e3 / args.iters
    # Correctness: a fresh buffer, one all-reduce, every element against the known sum.
    y = pattern(torch, n, args.rank, device)
    dist.all_reduce(y)
    world = args.world
    expected = pattern(torch, n, 0, device).sub_(1).mul_(world).add_(world * (world + 1) / 2)
    wrong = torch.tensor([int((y != expected).sum().item())], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)
    algbw = n_bytes / (ms / 1e3) / 1e9
    return {"bytes": n_bytes, "ms": ms, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (world - 1) / world,
            "wrong": int(wrong.item())}


def main(argv: list[str]) -> int:
    args = parse(argv)
    step = "import torch"
    emit(event="step", step=step)
    try:
        import torch
        import torch.distributed as dist

        emit(event="ready")
        step = "waiting for the start signal"
        emit(event="step", step=step)
        if sys.stdin.readline().strip() != "go":
            emit(event="error", step=step, error="cancelled before the measurement")
            return 0
        cuda = args.backend == "nccl"
        step = "cuda init"
        emit(event="step", step=step)
        device = torch.device("cuda", args.rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
            torch.empty(1, device=device)  # this rank's CUDA context, before NCCL starts
        step = "init_process_group"
        emit(event="step", step=step)
        t = time.perf_counter()
        kwargs = {"backend": args.backend, "init_method": args.init, "rank": args.rank, "world_size": args.world,
                  "timeout": datetime.timedelta(seconds=args.timeout)}
        if cuda and "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = device  # binds the communicator to this GPU at once (torch >= 2.3)
        dist.init_process_group(**kwargs)
        step = "first all_reduce"
        emit(event="step", step=step)
        warm = torch.ones(1, device=device)
        dist.all_reduce(warm)  # NCCL creates its communicator lazily: the first collective pays it
        if cuda:
            torch.cuda.synchronize()
        nccl = None
        if cuda:
            try:
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:  # noqa: BLE001 (a version is nice to have)
                pass
        emit(event="init", ms=(time.perf_counter() - t) * 1e3, backend=args.backend, nccl_version=nccl)
        free = torch.cuda.mem_get_info(device)[0] if cuda else None
        for mib in (int(s) for s in args.sizes.split(",") if s):
            n_bytes = mib * 2**20
            if free is not None and 3 * n_bytes > free // 2:
                continue  # two buffers and NCCL's own must fit with room to spare
            step = f"all_reduce of {mib} MiB"
            emit(event="step", step=step)
            result = measure(torch, dist, args, device, cuda, n_bytes)
            if args.rank == 0:
                emit(event="result", **result)
        step = "destroy_process_group"
        emit(event="step", step=step)
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 (reported to the runner with the step it happened in)
        emit(event="error", step=step, error=f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
