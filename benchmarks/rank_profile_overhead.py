"""What profiling costs inside each rank of a DDP job (target, as for ``%%gpuprofile``: < 1 %).

One torchrun launch, two ranks (NCCL on two GPUs; ``--cpu``: gloo, for a local try). Inside each
rank, blocks of training steps alternate, in the same shuffled order on every rank, between
gpunb's rank recorder installed (what a ``%%gpuprofile`` cell gives a worker: the optimizer-step
hook with CUDA events, DDP's timing read after the first steps, a record written every 2 s, the
NVML thread) and not installed. Each block is timed with a synchronize at both ends. Two loops:
launch-bound (8 x Linear(1024), batch 64, AdamW) and compute-bound (4 x Linear(8192), bf16,
batch 4096). Reported: per loop and rank, the median over rounds of (on - off) / off, with the
range. Usage, on a machine with >= 2 GPUs:

    python benchmarks/rank_profile_overhead.py --out DIR [--rounds 8]

Writes DIR/rank_profile_overhead.json. NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

RANK = textwrap.dedent("""
    import json, os, random, sys, tempfile, time
    import torch, torch.distributed as dist
    from gpunb.analysis.ranks import recorder as rank_recorder
    from gpunb.analysis.ranks.recorder import RankInstruments

    cpu, rounds, results = sys.argv[1] == "cpu", int(sys.argv[2]), sys.argv[3]
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dev = torch.device("cpu") if cpu else torch.device("cuda", local)
    if not cpu:
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo" if cpu else "nccl")
    sync = (lambda: None) if cpu else torch.cuda.synchronize

    def loop(kind):
        torch.manual_seed(0)
        if kind == "launch-bound":
            model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(dev)
            x, dtype, steps = torch.randn(64, 1024, device=dev), None, (40 if cpu else 400)
        else:
            width = 1024 if cpu else 8192
            model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(dev)
            x, dtype, steps = torch.randn(512 if cpu else 4096, width, device=dev), torch.bfloat16, (10 if cpu else 60)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if cpu else [local])
        recorder.ddp.add(ddp)  # as if built while the recorder was in: its timing is read too
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

        def step():
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                loss = ddp(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        return step, steps

    channel = tempfile.mkdtemp(prefix="gpunb-bench-")
    recorder = rank_recorder.start(channel, "benchmark")
    recorder.instruments.remove()
    out = {}
    for kind in ("launch-bound", "compute-bound"):
        step, steps = loop(kind)
        for _ in range(steps):  # warm-up
            step()
        order = random.Random(7)  # the same order on every rank: DDP steps in lockstep
        per = {"off": [], "on": []}
        for _ in range(rounds):
            for variant in order.sample(["off", "on"], 2):
                if variant == "on":
                    recorder.instruments = RankInstruments(torch, recorder)
                    recorder.instruments.install(not cpu)
                sync(); t = time.perf_counter()
                for _ in range(steps):
                    step()
                sync(); dt = time.perf_counter() - t
                if variant == "on":
                    recorder.instruments.remove()
                per[variant].append(dt * 1e3 / steps)
        out[kind] = per
    # a file per rank: two ranks printing at once can share one stdout line (seen on the H200)
    with open(os.path.join(results, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "per": out}, f)
    dist.destroy_process_group()
""")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU processes (a local try, not the figure)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if not args.cpu:
        from gpunb.readings.nvml import NvmlSession

        if NvmlSession().device_count() < 2:
            print("needs >= 2 GPUs (or --cpu)")
            return
    work = Path(tempfile.mkdtemp(prefix="gpunb-bench-"))
    script = work / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, **NO_MULTICAST, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), "cpu" if args.cpu else "gpu", str(args.rounds), str(work)],
                          capture_output=True, text=True, env=env, timeout=1200)
    results = [json.loads(p.read_text()) for p in sorted(work.glob("rank*.json"))]
    if proc.returncode != 0 or len(results) != 2:
        raise SystemExit(f"torchrun failed ({proc.returncode}): {proc.stderr[-3000:]}")
    table = {}
    print(f"{'loop':14} {'rank':>4} {'off ms/step':>12} {'on ms/step':>11} {'overhead (median, range)':>28}")
    for r in sorted(results, key=lambda r: r["rank"]):
        for kind, per in r["per"].items():
            ratios = [(on - off) / off for off, on in zip(per["off"], per["on"])]
            row = {"off_ms": statistics.median(per["off"]), "on_ms": statistics.median(per["on"]),
                   "overhead_median": statistics.median(ratios), "overhead_min": min(ratios),
                   "overhead_max": max(ratios), "rounds": per}
            table[f"{kind} rank {r['rank']}"] = row
            print(f"{kind:14} {r['rank']:>4} {row['off_ms']:12.3f} {row['on_ms']:11.3f} "
                  f"{100 * row['overhead_median']:+9.2f} % [{100 * row['overhead_min']:+.2f} .. "
                  f"{100 * row['overhead_max']:+.2f}]")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rank_profile_overhead.json").write_text(json.dumps({"cpu": args.cpu, "table": table}, indent=2))


if __name__ == "__main__":
    main()
