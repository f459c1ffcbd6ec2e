"""What counting one step's FLOPs costs, and where that cost comes from.

``%%gpuprofile`` counts the FLOPs of one step per cell (analysis/steps/flop_count.py) and must not
spend more than one step's worth of time on it (issue 15). This benchmark times the same
training step (benchmarks/training_loops.py) four ways, interleaved round by round so the
machine's drift hits all alike, each step synchronized before and after:

- ``plain``: nothing added;
- ``empty mode``: a ``TorchDispatchMode`` that only calls each operation (torch's own price
  for seeing every operation from Python, which any counter of this kind pays);
- ``gpunb``: gpunb's counter, begun and ended as ``%%gpuprofile``'s step hook does;
- ``FlopCounterMode``: torch's own counter (``display=False``), for comparison.

It reports each way's median step, what it adds in steps' worth and per operation, and the
phases of a step (forward / backward / optimizer, each synchronized) under ``plain``,
``empty mode`` and ``gpunb``'s mode, because on CUDA the backward runs in autograd's device thread, where every
operation the mode sees must take the GIL. Last, a cProfile of gpunb's counted step (its own
functions only) says which of gpunb's lines cost what.

    python benchmarks/flop_count_cost.py --out DIR                     # CUDA when present
    python benchmarks/flop_count_cost.py --out DIR --device cpu        # this machine's CPU
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training_loops import build_loop, synchronize  # noqa: E402  (benchmarks/, beside this file)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for flop_count_cost_<loop>.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--loop", default="launch-bound")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from gpunb.analysis.steps.flop_count import StepFlopCounter

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loop = build_loop(args.loop, device)

    class EmptyMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    ops_seen = {}

    def plain() -> None:
        loop.run(1)

    def empty_mode() -> None:
        with EmptyMode():
            loop.run(1)

    def gpunb_counter() -> None:
        counter = StepFlopCounter(torch)
        counter.begin(1)
        loop.run(1)
        counter.end()
        assert counter.result is not None, counter.why_not
        ops_seen["gpunb"] = counter.result.ops

    def flop_counter_mode() -> None:
        with FlopCounterMode(display=False):
            loop.run(1)

    ways = {"plain": plain, "empty mode": empty_mode, "gpunb": gpunb_counter, "FlopCounterMode": flop_counter_mode}
    loop.run(5)
    for fn in ways.values():  # first calls (imports, operator tables) outside the timing
        fn()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append((time.perf_counter() - t0) * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    ops = ops_seen.get("gpunb") or 0
    base = med["plain"]
    rows = {name: {"median_ms": m, "extra_steps": (m - base) / base,
                   "extra_us_per_op": (m - base) * 1e3 / ops if ops else None,
                   "min_ms": min(times[name]), "max_ms": max(times[name])} for name, m in med.items()}

    from gpunb.analysis.steps.flop_count import _mode_class, _tf32_flags

    modes = {"plain": None, "empty mode": EmptyMode, "gpunb": lambda: _mode_class(torch)(_tf32_flags(torch))}
    phases = phase_times(torch, loop, device, modes, rounds=max(5, args.rounds // 2))
    hot = profile_counted_step(torch, loop, StepFlopCounter)
    result = {"meta": {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                       "torch": torch.__version__, "python": platform.python_version(), "loop": args.loop,
                       "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M")},
              "ops_per_step": ops, "ways": rows, "phases_ms": phases, "gpunb_hot_functions": hot}
    print(f"{args.loop} on {result['meta']['device']} (torch {torch.__version__}): {ops} operations per step, "
          f"{args.rounds} interleaved rounds, medians")
    for name, r in rows.items():
        per_op = f"{r['extra_us_per_op']:+.2f} µs/op" if r["extra_us_per_op"] is not None else ""
        print(f"  {name:<16} {r['median_ms']:8.3f} ms  {r['extra_steps']:+.2f} steps' worth  {per_op}")
    for name, p in phases.items():
        print(f"  phases, {name:<10} " + "  ".join(f"{k} {v:.3f} ms" for k, v in p.items()))
    print("  gpunb's own functions in a counted step (cProfile, tottime ms):")
    for fn, ms in hot:
        print(f"    {ms:7.3f}  {fn}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"flop_count_cost_{args.loop}_{device}.json"
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")


def phase_times(torch, loop, device: str, modes: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Forward, backward and optimizer step apart, each synchronized, under each of ``modes``
    (name -> a dispatch mode's factory, None for none)."""
    model, opt = loop.model, loop.optimizer
    x = torch.randn(loop.shape.batch, loop.shape.width, device=device, dtype=getattr(torch, loop.shape.dtype))
    out: dict[str, dict[str, list[float]]] = {name: {} for name in modes}
    for _ in range(rounds):
        for name, factory in modes.items():
            mode = factory() if factory is not None else None
            if mode is not None:
                mode.__enter__()
            marks = [time.perf_counter()]
            loss = model(x).float().pow(2).mean()
            synchronize(device)
            marks.append(time.perf_counter())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            synchronize(device)
            marks.append(time.perf_counter())
            opt.step()
            synchronize(device)
            marks.append(time.perf_counter())
            if mode is not None:
                mode.__exit__(None, None, None)
            for phase, a, b in zip(("forward", "backward", "optimizer"), marks, marks[1:]):
                out[name].setdefault(phase, []).append((b - a) * 1e3)
    return {name: {phase: statistics.median(v) for phase, v in p.items()} for name, p in out.items()}


def profile_counted_step(torch, loop, counter_class) -> list[tuple[str, float]]:
    prof = cProfile.Profile()
    counter = counter_class(torch)
    prof.enable()
    counter.begin(1)
    loop.run(1)
    counter.end()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "gpunb" in file or "flop_counter" in file or "_python_dispatch" in file:
            rows.append((f"{Path(file).name}:{line}({name})", tottime * 1e3))
    return sorted(rows, key=lambda r: -r[1])[:12]


if __name__ == "__main__":
    main()
