"""What torch's allocation history costs while it records (``%%gpumem --trace``, ``%gpumem --trace on``).

The history is torch's own (``torch.cuda.memory._record_memory_history(enabled="all",
context="all", stacks="python")``, the settings gpunb uses): for every allocation and free it
keeps the Python stack. Its price is paid on every allocator call, so it is measured on the two
loops of ``training_loops.py``: the launch-bound one (many small allocations per ms: the worst
case) and the compute-bound one.

Each loop runs in its own fresh process. Blocks of ``--block-s`` worth of steps, history off and
on, run back to back in pairs whose order alternates (off-on, on-off, ...); each block ends
with a synchronize. Per pair: ratio = on time / off time; reported: the median ratio over
``--rounds`` pairs with its min and max, and the per-step cost in µs. Also, per loop: events
recorded per step, what ``%%gpumem --trace`` itself adds at the end of a cell (snapshot + replay
+ census) for a 20-step cell, and the size of the pickle ``--save`` would write.

    python benchmarks/alloc_history_cost.py --out DIR               # ~1 min on an H200
    python benchmarks/alloc_history_cost.py --out DIR --device cpu  # smoke: says it needs CUDA

Results: ``DIR/alloc_history_cost.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _steps_for(loop, seconds: float) -> int:
    loop.run(3)
    loop.sync()
    t0 = time.perf_counter()
    loop.run(10)
    loop.sync()
    per = (time.perf_counter() - t0) / 10
    return max(5, int(seconds / per))


def _timed(loop, steps: int) -> float:
    t0 = time.perf_counter()
    loop.run(steps)
    loop.sync()
    return time.perf_counter() - t0


def measure(name: str, rounds: int, block_s: float) -> dict:
    """In this process: the loop ``name`` on CUDA, history off vs on."""
    import pickle

    import torch

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    from training_loops import build_loop

    from gpunb.analysis.memory.alloc_trace import TraceSession
    from gpunb.readings.alloc_history import CELL_MAX_ENTRIES, history_enabled

    loop = build_loop(name, "cuda")
    steps = _steps_for(loop, block_s)
    record = torch.cuda.memory._record_memory_history

    def on_block() -> float:
        record(enabled="all", context="all", stacks="python", max_entries=CELL_MAX_ENTRIES, clear_history=True)
        try:
            return _timed(loop, steps)
        finally:
            record(enabled=None)

    pairs = []
    for r in range(rounds):
        if r % 2 == 0:
            off = _timed(loop, steps)
            on = on_block()
        else:
            on = on_block()
            off = _timed(loop, steps)
        pairs.append((off, on))
    ratios = sorted(on / off for off, on in pairs)
    per_step_us = sorted((on - off) / steps * 1e6 for off, on in pairs)
    # events per step and the trace's own end-of-cell work, on a 20-step cell
    session = TraceSession(torch=torch, namespace={"model": loop.model, "opt": loop.optimizer})
    session.start()
    loop.run(20)
    loop.sync()
    t0 = time.perf_counter()
    trace = session.stop()
    report_s = time.perf_counter() - t0
    record(enabled="all", context="all", stacks="python", max_entries=CELL_MAX_ENTRIES, clear_history=True)
    loop.run(20)
    loop.sync()
    snap = torch.cuda.memory._snapshot()
    record(enabled=None)
    events = len(snap["device_traces"][torch.cuda.current_device()])
    return {
        "loop": name,
        "steps_per_block": steps,
        "rounds": rounds,
        "step_ms_off": statistics.median(off for off, _ in pairs) / steps * 1e3,
        "ratio_on_off_median": statistics.median(ratios),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
        "cost_us_per_step_median": statistics.median(per_step_us),
        "events_per_step": events / 20,
        "trace_end_of_cell_s_20_steps": report_s,
        "trace_peak_equals_torch": trace.peak_bytes == trace.torch_peak_bytes,
        "trace_unavailable": trace.unavailable,
        "snapshot_pickle_bytes_20_steps": len(pickle.dumps(snap)),
        "history_left_on": history_enabled(torch),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for alloc_history_cost.json")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block-s", type=float, default=0.15)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.rounds, args.block_s)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loops": []}
    if args.device == "cpu":
        result["skipped"] = "the allocation history is CUDA's caching allocator's: run with a GPU"
        print(result["skipped"])
    else:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        for name in ("launch-bound", "compute-bound"):  # each in a fresh process
            proc = subprocess.run([sys.executable, __file__, "--out", str(out), "--child", name, "--rounds",
                                   str(args.rounds), "--block-s", str(args.block_s)],
                                  capture_output=True, text=True, env=env, timeout=600)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                result["loops"].append({"loop": name, "error": proc.stderr[-2000:]})
                continue
            result["loops"].append(json.loads(lines[-1][len("RESULT "):]))
    (out / "alloc_history_cost.json").write_text(json.dumps(result, indent=2))
    for r in result["loops"]:
        if "error" in r:
            print(f"{r['loop']}: failed: {r['error'][-400:]}")
            continue
        print(f"{r['loop']:<14} step {r['step_ms_off']:.2f} ms; history on/off {r['ratio_on_off_median']:.3f} "
              f"[{r['ratio_min']:.3f} .. {r['ratio_max']:.3f}], {r['cost_us_per_step_median']:.0f} us/step, "
              f"{r['events_per_step']:.0f} events/step; %%gpumem --trace end of a 20-step cell "
              f"{r['trace_end_of_cell_s_20_steps'] * 1e3:.0f} ms, "
              f"pickle {r['snapshot_pickle_bytes_20_steps'] / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
