"""Which part of %%gpuprofile's instrumentation costs what per step, on the launch-bound loop.

Each variant adds one instrument to the previous one; all run interleaved in one process,
as paired rounds against a no-instrument cell. Usage:
    python benchmarks/profile_ablation.py --out DIR [--cell-s 1.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_overhead import make_loop, sync  # noqa: E402  (the same loop as the overhead benchmark)


def variants(torch):
    from gpunb.analysis.instruments import Instruments

    def build(memory: bool, wraps: bool, output: bool):
        def start():
            ins = Instruments(torch, memory_every_s=0.05 if memory else None)
            ins._hook_optimizer(torch)  # the step hook records a CUDA event per step
            if wraps:
                ins._wrap_tensor_syncs(torch)
                ins._wrap_dataloader(torch)
            if output:
                ins._wrap_output()
            return ins

        return start

    return {
        "step hook + event": build(False, False, False),
        "+ memory timeline": build(True, False, False),
        "+ tensor/loader wraps": build(True, True, False),
        "+ output wrap": build(True, True, True),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--cell-s", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    run, _ = make_loop("launch-bound", device)
    run(20)
    sync(device)
    t = time.perf_counter()
    run(50)
    sync(device)
    steps = max(50, int(args.cell_s / ((time.perf_counter() - t) / 50)))
    makers = variants(torch)

    def cell(start=None) -> float:
        gc.collect()
        ins = start() if start else None
        sync(device)
        t0 = time.perf_counter()
        run(steps)
        sync(device)
        dt = time.perf_counter() - t0
        if ins is not None:
            ins.remove()
        return dt / steps * 1e3

    ratios: dict[str, list[float]] = {name: [] for name in makers}
    base_ms: list[float] = []
    for _ in range(args.rounds):
        for name, start in makers.items():  # each variant paired with its own baseline cell
            b = cell()
            v = cell(start)
            base_ms.append(b)
            ratios[name].append(v / b - 1)
    print(f"launch-bound loop on {device}: {steps} steps/cell, baseline {statistics.median(base_ms):.3f} ms/step")
    table = {}
    for name, r in ratios.items():
        med = statistics.median(r)
        us = med * statistics.median(base_ms) * 1e3
        table[name] = {"overhead_pct": 100 * med, "min_pct": 100 * min(r), "max_pct": 100 * max(r), "us_per_step": us}
        print(f"{name:24} {100 * med:+7.2f} %  [{100 * min(r):+.2f} .. {100 * max(r):+.2f}]  {us:+8.1f} µs/step")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_ablation.json").write_text(json.dumps({"steps": steps, "base_ms": base_ms, "variants": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
