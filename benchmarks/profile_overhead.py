"""What profiling a cell costs: no profiler vs ``%%gpuprofile`` (its API twin
``gpunb.profile()``, the same machinery) vs ``%gpuprofile on`` (the per-cell meter the
one-line mode runs in pre/post_run_cell) vs ``torch.profiler.profile()`` with defaults.

Two loops: launch-bound (a 30-layer 256-wide MLP with AdamW, many small kernels) and
compute-bound (bf16 8192x8192 matmuls on a GPU; small fp32 ones on a CPU). Every "cell"
runs a fixed number of steps, including the profiler's own start/stop and a final
synchronize. Modes are interleaved round by round (order rotated), and the median over
rounds is compared, so drift in clocks or temperature hits every mode alike.

    python benchmarks/profile_overhead.py --out DIR          # ~1.5 min on an H200
    python benchmarks/profile_overhead.py --out DIR --device cpu --rounds 5   # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpunb  # noqa: E402
from gpunb.analysis.cell_meter import CellMeter  # noqa: E402

MODES = ("none", "gpuprofile", "one-line", "torch.profiler")


def make_loop(kind: str, device: str):
    torch.manual_seed(0)
    if kind == "launch-bound":
        width = 256 if device == "cuda" else 32
        layers = []
        for _ in range(30):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).to(device)
        x = torch.randn(64, width, device=device)
        steps = 200 if device == "cuda" else 10
    else:
        n = 8192 if device == "cuda" else 128
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = torch.nn.Sequential(*[torch.nn.Linear(n, n, bias=False) for _ in range(4)]).to(device, dtype)
        x = torch.randn(n, n, device=device, dtype=dtype)
        steps = 20 if device == "cuda" else 5
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return run, steps


@contextlib.contextmanager
def one_line():
    meter = CellMeter()
    meter.start()
    try:
        yield
    finally:
        meter.stop()


def context(mode: str):
    if mode == "none":
        return contextlib.nullcontext()
    if mode == "gpuprofile":
        return gpunb.profile(record=False)
    if mode == "one-line":
        return one_line()
    return torch.profiler.profile()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(kind: str, device: str, rounds: int) -> dict:
    run, steps = make_loop(kind, device)
    for _ in range(3):
        run()
    sync(device)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for mode in order:
            sync(device)
            t0 = time.perf_counter()
            with context(mode):
                run()
                sync(device)
            times[mode].append((time.perf_counter() - t0) / steps * 1000)
    base = statistics.median(times["none"])
    return {"loop": kind, "steps_per_cell": steps, "rounds": rounds, "ms_per_step": times,
            "median_ms": {m: statistics.median(v) for m, v in times.items()},
            "overhead_pct": {m: 100 * (statistics.median(v) / base - 1) for m, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for profile_overhead.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 11 on CUDA, 3 on CPU)")
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 11 if args.device == "cuda" else 3
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("profile_overhead: --device cuda but torch sees no CUDA GPU; use --device cpu", file=sys.stderr)
        return 2
    results = [measure(kind, args.device, args.rounds) for kind in ("launch-bound", "compute-bound")]
    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if args.device == "cuda"
            else platform.processor() or "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "gpunb": gpunb.__version__}
    print(f"profile overhead · {meta['device']} · torch {meta['torch']} · {meta['date']} · median of {args.rounds} "
          "interleaved rounds")
    print(f"{'loop':<14} {'mode':<15} {'ms/step':>9} {'overhead':>9}")
    targets = {"gpuprofile": 1.0, "one-line": 0.2}  # % of step time, from issue 4
    for res in results:
        for m in MODES:
            mark = ""
            if m in targets:
                mark = "  ok" if res["overhead_pct"][m] < targets[m] else f"  over the {targets[m]}% target"
            print(f"{res['loop']:<14} {m:<15} {res['median_ms'][m]:>9.3f} {res['overhead_pct'][m]:>+8.2f}%{mark}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_overhead.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"written: {out / 'profile_overhead.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
