"""How right and how cheap ``%%gpuprofile``'s energy is (issue 23), measured on the GPU.

``python3 benchmarks/energy_accuracy.py --out DIR`` (``--device cpu`` runs the code path only).

For each loop of ``training_loops.py`` (launch-bound, compute-bound):

- **accuracy**: NVML's energy counter read by this script (pynvml directly) right around the
  ``with gpunb.profile()`` block against the cell's energy gpunb reports; the two read the same
  counter a few ms apart, so they must agree within 1 %.
- **the estimate**: NVML's power samples integrated over the same cell (the fallback where the
  counter is missing) against the counter: its error, shown with it.
- **steadiness**: the per-step energy of each 1 s window after the warm-up; spread =
  (max - min) / median, target under 5 %.
- **cost**: cells with the energy meter on and off, interleaved; the median cell time of each,
  and the difference as a share (target under 0.5 %).

Writes ``DIR/energy_accuracy.json`` and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

from training_loops import LOOPS, build_loop


def counter_mj(index: int = 0) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(index)))
    except Exception:
        return None


def profiled_cell(loop, steps: int, energy: bool) -> tuple[float, object, int | None, int | None]:
    import gpunb

    loop.sync()
    before = counter_mj()
    t0 = time.perf_counter()
    with gpunb.profile(record=False, show=False, flops=False, energy=energy) as p:
        loop.run(steps)
        loop.sync()
    seconds = time.perf_counter() - t0
    after = counter_mj()
    return seconds, p.result, before, after


def measure(name: str, device: str, cell_s: float, rounds: int) -> dict:
    loop = build_loop(name, device)
    loop.run(5)
    loop.sync()
    t0 = time.perf_counter()
    loop.run(20)
    loop.sync()
    step_s = (time.perf_counter() - t0) / 20
    steps = max(20, int(cell_s / step_s))
    out: dict = {"loop": name, "device": device, "steps_per_cell": steps, "step_ms": step_s * 1e3, "cells": []}
    timings: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for energy in ((True, False) if r % 2 == 0 else (False, True)):
            seconds, result, before, after = profiled_cell(loop, steps, energy)
            timings[energy].append(seconds)
            cell = getattr(result, "energy", None)
            if energy and cell is not None:
                independent = (after - before) / 1000.0 if before is not None and after is not None else None
                out["cells"].append({
                    "gpunb_j": cell.joules, "independent_j": independent,
                    "error": (cell.joules / independent - 1.0) if independent else None,
                    "source": cell.gpus[0].source if cell.gpus else None,
                    "step_j": cell.step_joules, "window_step_j": list(cell.window_step_joules),
                    "spread": cell.step_spread, "average_w": cell.average_w, "seconds": cell.seconds,
                    "estimate_j": estimate_j(result),
                })
    on, off = statistics.median(timings[True]), statistics.median(timings[False])
    out.update(median_on_s=on, median_off_s=off, cost=(on / off - 1.0))
    errors = [abs(c["error"]) for c in out["cells"] if c["error"] is not None]
    spreads = [c["spread"] for c in out["cells"] if c["spread"] is not None]
    est = [c["estimate_j"] / c["independent_j"] - 1.0 for c in out["cells"]
           if c.get("estimate_j") and c["independent_j"]]
    out.update(max_abs_error=max(errors) if errors else None, median_spread=statistics.median(spreads) if spreads
               else None, estimate_error=statistics.median(est) if est else None)
    return out


def estimate_j(result) -> float | None:
    """The power-sample integral over the cell (what the fallback would have said)."""
    try:
        from gpunb.readings.energy import PowerSamples, read_power_since
        from gpunb.readings.nvml import default_session

        extra = getattr(result, "extra", {}) or {}
        start_us, end_us = extra.get("energy_start_us"), extra.get("energy_end_us")
        if start_us is None or end_us is None:
            return None
        samples = read_power_since(default_session(), 0, start_us - 2_000_000)
        return samples.joules(start_us, end_us) if isinstance(samples, PowerSamples) else None
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"))
    parser.add_argument("--cell-s", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cell_s, rounds = (args.cell_s, args.rounds) if device == "cuda" else (0.3, 2)
    results = [measure(name, device, cell_s, rounds) for name in LOOPS]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "energy_accuracy.json").write_text(json.dumps({"device": device, "results": results}, indent=1))
    print(f"{'loop':14} {'cells':>5} {'max |err|':>9} {'estimate':>9} {'spread':>7} {'J/step':>8} {'cost':>7}")
    for r in results:
        step = statistics.median([c["step_j"] for c in r["cells"] if c["step_j"]] or [float("nan")])

        def pct(x):
            return f"{x * 100:+.2f}%" if isinstance(x, float) else "n/a"

        print(f"{r['loop']:14} {len(r['cells']):>5} {pct(r['max_abs_error']):>9} {pct(r['estimate_error']):>9} "
              f"{pct(r['median_spread']):>7} {step:8.3f} {pct(r['cost']):>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
