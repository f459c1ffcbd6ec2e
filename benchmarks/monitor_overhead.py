"""What the live monitor costs a training loop.

Step time of a training loop with the monitor off, on at 2 Hz and on at 10 Hz, in
interleaved rounds of one run (the order rotates each round, so drift hits all variants
alike), plus the sampler thread's own CPU time per second. "On" is the real work of a
live ``%gpumonitor``: the sampler tick (NVML, process list every 5 s, host) and the
listener that redraws the HTML panel of a 120 s window (incrementally, charts as data-URI
SVG images, at most 4 times a second). Only the send of the redrawn output is missing (no
kernel here); it happens on ipykernel's IOPub thread.

Two loops: a small launch-bound MLP (the worst case for a Python thread taking the GIL)
and a matmul-bound one. On a CPU-only machine it runs tiny CPU models, which exercises
the code but measures nothing about GPUs.

    python benchmarks/monitor_overhead.py --out DIR [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gpunb.analysis.sampler import Sampler  # noqa: E402
from gpunb.shells.monitor import MIN_DRAW_INTERVAL_S, Monitor  # noqa: E402  (no IPython needed)

WINDOW_S = 120.0
VARIANTS = ("off", "2 Hz", "10 Hz")


def make_loop(kind: str, device: str):
    torch.manual_seed(0)
    if device == "cuda":
        width, depth, batch, dtype = (1024, 8, 64, None) if kind == "small" else (8192, 4, 8192, torch.bfloat16)
    else:
        width, depth, batch, dtype = (128, 4, 32, None) if kind == "small" else (512, 4, 256, None)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)

    def step() -> None:
        if dtype is not None:
            with torch.autocast(device, dtype=dtype):
                loss = model(x).float().pow(2).mean()
        else:
            loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(step, steps: int, device: str) -> float:
    for _ in range(3):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def run_variant(variant: str, sampler: Sampler, step, steps: int, device: str) -> tuple[float, float, float]:
    """Step ms, and the sampler thread's CPU and wall seconds during this run."""
    if variant == "off":
        return timed(step, steps, device), 0.0, 0.0
    sampler.set_hz(float(variant.split()[0]))
    cpu0, wall0 = sampler.thread_cpu_s, sampler.thread_wall_s
    sampler.start()
    time.sleep(0.05)  # the thread's first tick (and its first draw) before timing
    try:
        ms = timed(step, steps, device)
    finally:
        sampler.stop()
    return ms, sampler.thread_cpu_s - cpu0, sampler.thread_wall_s - wall0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for monitor_overhead.json")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0, help="target seconds per timed run")
    parser.add_argument("--min-steps", type=int, default=20, help="fewest steps per timed run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    device = "cuda" if torch.cuda.is_available() else "cpu"
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
    for kind in ("small", "large"):
        step = make_loop(kind, device)
        probe = timed(step, 10, device)
        steps = max(args.min_steps, int(args.seconds * 1e3 / probe))
        per = {v: [] for v in VARIANTS}
        cpu = {v: [0.0, 0.0] for v in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
            for v in order:
                ms, c, w = run_variant(v, sampler, step, steps, device)
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
        results[kind] = {"steps_per_run": steps, "variants": rows}

    info = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "nvml_ok": sampler.status.ok,
        "gpus_sampled": len(sampler.gpus),
        "rounds": args.rounds,
        "window_s": WINDOW_S,
        "panel_html_bytes": drawn[-1] if drawn else None,
        "sampler_ticks": sampler.ticks,
        "sampler_notes": list(sampler.notes),
    }
    report = {"info": info, "results": results}
    (out / "monitor_overhead.json").write_text(json.dumps(report, indent=1))

    print(f"monitor overhead on {info['device']} (torch {info['torch']}, {args.rounds} interleaved rounds, "
          f"{info['gpus_sampled']} GPU(s) sampled, panel {info['panel_html_bytes']} bytes per draw)")
    print(f"{'loop':6} {'monitor':8} {'step ms (median)':>17} {'min':>8} {'max':>8} {'slowdown':>9} {'sampler CPU/s':>14}")
    for kind, res in results.items():
        for v, row in res["variants"].items():
            print(f"{kind:6} {v:8} {row['step_ms_median']:17.3f} {row['step_ms_min']:8.3f} {row['step_ms_max']:8.3f} "
                  f"{row['slowdown_vs_off_median_paired']:+9.2%} {row['sampler_cpu_s_per_s']:14.4f}")
    print(f"target: slowdown under 0.5 % at 2 Hz; written to {out / 'monitor_overhead.json'}")


if __name__ == "__main__":
    main()
