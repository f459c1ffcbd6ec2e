"""What the live monitor costs a training loop.

Step time of a training loop with the monitor off, and on at 2 Hz and at 10 Hz each with and
without the energy and link reads ("base": the monitor before them; issue 23), in interleaved
rounds of one run (the order rotates each round, so drift hits all variants alike), plus the
sampler thread's own CPU time per second. "On" is the real work of a live ``%gpumonitor``: the
sampler tick (NVML, process list every 5 s, host; the energy counter, NVLink counters and PCIe
throughput in turns) and the listener that redraws the HTML panel of a 120 s window
(incrementally, charts as data-URI SVG images, at most 4 times a second). Only the send of the
redrawn output is missing (no kernel here); it happens on ipykernel's IOPub thread.

Two loops, the ones ``profile_overhead.py`` times too (both built by ``training_loops.py``):
``launch-bound``, a small MLP (the worst case for a Python thread taking the GIL), and
``compute-bound``, bf16 8192-wide matmuls. On a CPU-only machine (or with ``--device cpu``)
it runs them at tiny CPU sizes, which exercises the code but measures nothing about GPUs.

    python benchmarks/monitor_overhead.py --out DIR [--rounds 6]
    python benchmarks/monitor_overhead.py --out DIR --smoke     # a few seconds: 1 round of 0.3 s runs
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from training_loops import LOOPS, SHAPES, TrainingLoop, build_loop  # noqa: E402  (benchmarks/, beside this file)

from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.shells.monitor import MIN_DRAW_INTERVAL_S, Monitor  # noqa: E402  (no IPython needed)

WINDOW_S = 120.0
VARIANTS = ("off", "2 Hz base", "2 Hz", "10 Hz base", "10 Hz")  # base: without the energy and link reads


def timed(loop: TrainingLoop, steps: int) -> float:
    """Milliseconds per step over ``steps`` steps, after 3 warm-up steps."""
    loop.run(3)
    loop.sync()
    t0 = time.perf_counter()
    loop.run(steps)
    loop.sync()
    return (time.perf_counter() - t0) / steps * 1e3


def run_variant(variant: str, sampler: Sampler, loop: TrainingLoop, steps: int) -> tuple[float, float, float]:
    """Step ms, and the sampler thread's CPU and wall seconds during this run."""
    if variant == "off":
        return timed(loop, steps), 0.0, 0.0
    sampler.set_hz(float(variant.split()[0]))
    sampler.read_links = not variant.endswith("base")
    cpu0, wall0 = sampler.thread_cpu_s, sampler.thread_wall_s
    sampler.start()
    time.sleep(0.05)  # the thread's first tick (and its first draw) before timing
    try:
        ms = timed(loop, steps)
    finally:
        sampler.stop()
    return ms, sampler.thread_cpu_s - cpu0, sampler.thread_wall_s - wall0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for monitor_overhead.json")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0, help="target seconds per timed run")
    parser.add_argument("--min-steps", type=int, default=20, help="fewest steps per timed run")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees a GPU")
    parser.add_argument("--smoke", action="store_true",
                        help="a dry run of a few seconds: --rounds 1 --seconds 0.3 --min-steps 3 (measures nothing)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.min_steps = 1, 0.3, 3
    if args.rounds < 1 or args.min_steps < 1 or args.seconds <= 0:
        parser.error("--rounds and --min-steps must be >= 1 and --seconds > 0")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA GPU; use --device cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sampler = Sampler(hz=2)
    view = Monitor(sampler, {}, window_s=WINDOW_S, devices=None, live=False)
    drawn = []
    last = [0.0]

    def draw(_sampler: Sampler) -> None:
        # What the live monitor's listener does on the sampler thread (same throttle):
        # draw the panel of the last 120 s incrementally. Only the send is missing.
        now = time.monotonic()
        if now - last[0] >= MIN_DRAW_INTERVAL_S * 0.9:
            last[0] = now
            drawn.append(len(view._live_bundle()["text/html"]))

    sampler.add_listener(draw)
    sampler.tick()  # sampler set up outside the timings (NVML init, GPU facts)

    results = {}
    for kind in LOOPS:
        loop = build_loop(kind, device)
        probe = timed(loop, 10)
        steps = max(args.min_steps, int(args.seconds * 1e3 / probe))
        per = {v: [] for v in VARIANTS}
        cpu = {v: [0.0, 0.0] for v in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for v in order:
                ms, c, w = run_variant(v, sampler, loop, steps)
                per[v].append(ms)
                cpu[v][0] += c
                cpu[v][1] += w
        base = per["off"]
        rows = {}
        for v in VARIANTS:
            # Paired per round: on/off of the same round, so slow drift cancels.
            paired = [a / b - 1 for a, b in zip(per[v], base)]
            rows[v] = {
                "step_ms_median": statistics.median(per[v]),
                "step_ms_min": min(per[v]),
                "step_ms_max": max(per[v]),
                "slowdown_vs_off_median_paired": statistics.median(paired),
                "sampler_cpu_s_per_s": (cpu[v][0] / cpu[v][1]) if cpu[v][1] else 0.0,
                "runs_ms": per[v],
            }
        for hz in ("2 Hz", "10 Hz"):  # what the energy and link reads add, paired per round
            rows[hz]["links_vs_base_median_paired"] = statistics.median(
                [a / b - 1 for a, b in zip(per[hz], per[f"{hz} base"])])
        results[kind] = {"steps_per_run": steps, "variants": rows}

    info = {
        "date": time.strftime("%Y-%m-%d"),
        "device": (torch.cuda.get_device_name(0) if device == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "nvml_ok": sampler.status.ok,
        "gpus_sampled": len(sampler.gpus),
        "rounds": args.rounds,
        "window_s": WINDOW_S,
        "loop_shapes": {kind: asdict(SHAPES[(kind, device)]) for kind in LOOPS},
        "panel_html_bytes": drawn[-1] if drawn else None,
        "sampler_ticks": sampler.ticks,
        "nvlink_links": {i: len(g.active) for i, g in sampler.traffic.links.items()},
        "sampler_notes": list(sampler.notes),
    }
    report = {"info": info, "results": results}
    (out / "monitor_overhead.json").write_text(json.dumps(report, indent=1))

    print(f"monitor overhead on {info['device']} (torch {info['torch']}, {args.rounds} interleaved rounds, "
          f"{info['gpus_sampled']} GPU(s) sampled, panel {info['panel_html_bytes']} bytes per draw)")
    print(f"{'loop':13} {'monitor':10} {'step ms (median)':>17} {'min':>8} {'max':>8} {'slowdown':>9} "
          f"{'sampler CPU/s':>14}")
    for kind, res in results.items():
        for v, row in res["variants"].items():
            print(f"{kind:13} {v:10} {row['step_ms_median']:17.3f} {row['step_ms_min']:8.3f} {row['step_ms_max']:8.3f} "
                  f"{row['slowdown_vs_off_median_paired']:+9.2%} {row['sampler_cpu_s_per_s']:14.4f}")
        for hz in ("2 Hz", "10 Hz"):
            print(f"{kind:13} energy/link reads at {hz}: {res['variants'][hz]['links_vs_base_median_paired']:+.2%} "
                  "vs the same rate without them")
    print(f"target: slowdown under 0.5 % at 2 Hz; written to {out / 'monitor_overhead.json'}")


if __name__ == "__main__":
    main()
