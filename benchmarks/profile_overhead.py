"""What profiling a cell costs: no profiler vs ``%%gpuprofile`` (its API twin
``gpunb.profile()``, the same machinery) vs ``%gpuprofile on`` (the per-cell meter the
one-line mode runs in pre/post_run_cell) vs ``torch.profiler.profile()`` with defaults.

Two loops, each in its own fresh process (torch.profiler leaves CUPTI attached, and one
loop's allocator state must not leak into the other):

- launch-bound: an 8-layer 1024-wide MLP, batch 64, AdamW (the monitor benchmark's small
  loop, ~2.3 ms/step on an H200: host-bound, so per-step hook costs show in full);
- compute-bound: four bf16 8192x8192 layers (GPU-bound: host costs hide behind the GPU).

Every variant does identical work: the same model, optimizer and input tensors (made once,
on the device, before any timing), the same number of steps per cell (calibrated so a cell
lasts ``--cell-s`` seconds, like a real training cell), one synchronize at the end of the
cell's work, then the profiler's exit. Variants are interleaved round by round (order
rotated, ``gc.collect()`` before every cell) and compared pairwise within each round: the
overhead is the median of the per-round ratios, with min and max. torch.profiler runs in a
second phase after the gpunb variants, paired with its own no-profiler cells, so whatever it
leaves behind cannot slow the others.

Reported per loop, separately:
  (a) per-step overhead in µs: (body time with the profiler - without) / steps, where the
      body is the cell between the profiler's enter and exit; plus the step hooks timed
      directly (pre + post hook, event record), which is what a host-bound loop pays;
  (b) fixed per-cell cost in ms: the profiler's enter + exit (resets, syncs, NVML reads,
      building the report), timed around those calls;
  (c) overhead in % of a cell of this length.
Then a table of per-call costs on this machine (allocator reads, NVML calls, /proc reads).

    python benchmarks/profile_overhead.py --out DIR                 # ~2 min on an H200
    python benchmarks/profile_overhead.py --out DIR --device cpu    # CPU smoke run (tiny sizes)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOOPS = ("launch-bound", "compute-bound")
GPUNB_MODES = ("none", "gpuprofile", "one-line")
MODES = GPUNB_MODES + ("torch.profiler",)
TARGETS = {"gpuprofile": 1.0, "one-line": 0.2}  # % of the cell, from issue 4


# -- the loops ---------------------------------------------------------------------------
def make_loop(kind: str, device: str):
    import torch

    torch.manual_seed(0)
    cuda = device == "cuda"
    if kind == "launch-bound":
        width, depth, batch, dtype = (1024, 8, 64, torch.float32) if cuda else (32, 8, 16, torch.float32)
    else:
        width, depth, batch, dtype = (8192, 4, 8192, torch.bfloat16) if cuda else (256, 4, 256, torch.float32)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, bias=kind == "launch-bound"), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device, dtype=dtype)  # made once: no data work in the loop

    def run(steps: int) -> None:
        for _ in range(steps):
            loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return run, opt


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


@contextlib.contextmanager
def one_line():
    from gpunb.analysis.cell_meter import CellMeter

    meter = CellMeter()
    meter.start()
    try:
        yield
    finally:
        meter.stop()


def context(mode: str):
    import torch

    import gpunb

    if mode == "none":
        return contextlib.nullcontext()
    if mode == "gpuprofile":
        return gpunb.profile(record=False, show=False)
    if mode == "one-line":
        return one_line()
    return torch.profiler.profile()


def cell(mode: str, run, steps: int, device: str) -> dict:
    """One cell: enter, the steps, one synchronize, exit; each part timed."""
    gc.collect()
    sync(device)
    t0 = time.perf_counter()
    ctx = context(mode)
    ctx.__enter__()
    gc.disable()  # a collection landing in one variant's cell and not the other's is noise
    try:
        t1 = time.perf_counter()
        run(steps)
        sync(device)
        t2 = time.perf_counter()
    finally:
        gc.enable()
    ctx.__exit__(None, None, None)
    t3 = time.perf_counter()
    return {"total_s": t3 - t0, "enter_s": t1 - t0, "body_s": t2 - t1, "exit_s": t3 - t2}


def rounds_of(modes: tuple[str, ...], n: int, run, steps: int, device: str) -> list[dict]:
    out = []
    for r in range(n):
        k = r % len(modes)
        order = modes[k:] + modes[:k]
        out.append({m: cell(m, run, steps, device) for m in order})
    return out


def compare(rounds: list[dict], mode: str, steps: int) -> dict:
    ratios = [r[mode]["total_s"] / r["none"]["total_s"] for r in rounds]
    per_step_us = [(r[mode]["body_s"] - r["none"]["body_s"]) / steps * 1e6 for r in rounds]
    fixed_ms = [(r[mode]["enter_s"] + r[mode]["exit_s"]) * 1e3 for r in rounds]
    return {
        "overhead_pct": 100 * (statistics.median(ratios) - 1),
        "overhead_pct_min": 100 * (min(ratios) - 1),
        "overhead_pct_max": 100 * (max(ratios) - 1),
        "per_step_us": statistics.median(per_step_us),
        "fixed_ms": statistics.median(fixed_ms),
        "enter_ms": statistics.median(r[mode]["enter_s"] * 1e3 for r in rounds),
        "exit_ms": statistics.median(r[mode]["exit_s"] * 1e3 for r in rounds),
        "ms_per_step": statistics.median(r[mode]["total_s"] / steps * 1e3 for r in rounds),
    }


# -- per-call costs ----------------------------------------------------------------------
def per_call_us(fn, budget_s: float = 0.1, max_n: int = 2000) -> float:
    """Median µs per call over batches of calls, about ``budget_s`` in all."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    batch = max(1, min(max_n // 10, int(budget_s / 10 / one)))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(times)


def call_costs(device: str, opt) -> dict:
    import torch

    from gpunb.analysis.instruments import Instruments, _allocated_reserved
    from gpunb.analysis.profile import ProfileSession
    from gpunb.analysis.cell_meter import CellMeter
    from gpunb.readings.gpu_activity import nvml_index_for_uuid, now_us, read_device_memory, read_util_since
    from gpunb.readings.nvml import default_session
    from gpunb.readings.process import read_process_usage, reset_peak_rss
    from gpunb.readings import torch_state

    cuda = device == "cuda"
    costs: dict[str, float] = {}
    # the step hooks as a real cell runs them (pre + post hook, CUDA event on a GPU)
    ins = Instruments(torch, memory_every_s=None)
    ins.install(cuda)
    try:
        costs["step hooks (pre + post, event record)"] = per_call_us(
            lambda: (ins._before_step(opt, (), {}), ins._on_step(opt, (), {})), max_n=4000)
        t = torch.tensor(1.5)
        costs["float(t) wrapped (a counted host read)"] = per_call_us(lambda: float(t))
        ins._quiet = True
        costs["t.item() wrapped, inside optimizer.step()"] = per_call_us(lambda: t.item())
        ins._quiet = False
        costs["timeline point (allocator read; NVML used is listed apart)"] = per_call_us(lambda: ins.sample_memory(force=True), max_n=500)
    finally:
        ins.remove()
    if cuda:
        ins.finish_steps()
    t = torch.tensor(1.5)
    costs["float(t) plain"] = per_call_us(lambda: float(t))
    costs["t.item() plain"] = per_call_us(lambda: t.item())
    costs["read_process_usage (/proc/self/status)"] = per_call_us(read_process_usage, max_n=500)
    costs["reset_peak_rss (/proc/self/clear_refs)"] = per_call_us(reset_peak_rss, max_n=500)
    if cuda:
        dev = torch.cuda.current_device()
        costs["torch.cuda.Event() + record"] = per_call_us(lambda: torch.cuda.Event(enable_timing=True).record())
        costs["torch.cuda.memory_stats()"] = per_call_us(torch.cuda.memory_stats, max_n=500)
        costs["torch.cuda.memory_allocated()"] = per_call_us(torch.cuda.memory_allocated, max_n=500)
        costs["torch.cuda.max_memory_allocated()"] = per_call_us(torch.cuda.max_memory_allocated, max_n=500)
        costs["torch._C._cuda_memoryStats (nested)"] = per_call_us(lambda: _allocated_reserved(torch), max_n=500)
        costs["torch.cuda.reset_peak_memory_stats()"] = per_call_us(torch.cuda.reset_peak_memory_stats, max_n=500)
        costs["torch.cuda.synchronize() (idle)"] = per_call_us(torch.cuda.synchronize, max_n=500)
        nvml = default_session()
        if nvml.device_count():
            index = nvml_index_for_uuid(nvml, torch_state.device_uuid(torch, dev), dev)
            costs["NVML index by UUID"] = per_call_us(
                lambda: nvml_index_for_uuid(nvml, torch_state.device_uuid(torch, dev), dev), max_n=200)
            costs["NVML nvmlDeviceGetMemoryInfo"] = per_call_us(
                lambda: nvml.device_query(index, "nvmlDeviceGetMemoryInfo"), max_n=500)
            costs["NVML nvmlDeviceGetUtilizationRates"] = per_call_us(
                lambda: nvml.device_query(index, "nvmlDeviceGetUtilizationRates"), max_n=500)
            since = now_us() - 2_000_000
            costs["NVML util samples since 2 s ago"] = per_call_us(
                lambda: read_util_since(nvml, index, since), budget_s=0.2, max_n=100)
            costs["NVML device memory + process list"] = per_call_us(
                lambda: read_device_memory(nvml, index), budget_s=0.2, max_n=100)

    def empty_profile() -> None:
        s = ProfileSession()
        s.start()
        s.stop()

    def empty_meter() -> None:
        m = CellMeter()
        m.start()
        m.stop()

    costs["gpuprofile enter + exit, empty cell"] = per_call_us(empty_profile, budget_s=0.3, max_n=100)
    costs["one-line start + stop, empty cell"] = per_call_us(empty_meter, budget_s=0.2, max_n=200)
    return costs


# -- one loop, in this process --------------------------------------------------------------
def measure(kind: str, device: str, cell_s: float, rounds: int, profiler_rounds: int) -> dict:
    run, opt = make_loop(kind, device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min(1.0, cell_s):  # cuBLAS heuristics, allocator, clocks up
        run(5)
        sync(device)
    done, t0 = 0, time.perf_counter()
    while done < 10 or time.perf_counter() - t0 < cell_s / 4:  # calibrate over a quarter cell
        run(5)
        sync(device)
        done += 5
    step_s = (time.perf_counter() - t0) / done
    steps = max(10, round(cell_s / step_s))
    costs = call_costs(device, opt)
    gpunb_rounds = rounds_of(GPUNB_MODES, rounds, run, steps, device)
    prof_rounds = rounds_of(("none", "torch.profiler"), profiler_rounds, run, steps, device) if profiler_rounds else []
    none_ms = statistics.median(r["none"]["total_s"] for r in gpunb_rounds) / steps * 1e3
    res = {"loop": kind, "steps_per_cell": steps, "rounds": rounds, "profiler_rounds": profiler_rounds,
           "cell_s": none_ms * steps / 1e3, "modes": {"none": {"ms_per_step": none_ms}}}
    for m in GPUNB_MODES[1:]:
        res["modes"][m] = compare(gpunb_rounds, m, steps)
    if prof_rounds:
        res["modes"]["torch.profiler"] = compare(prof_rounds, "torch.profiler", steps)
        # its own paired no-profiler cells, after the profiler ran: CUPTI left attached shows here
        res["none_after_torch_profiler_ms_per_step"] = statistics.median(
            r["none"]["total_s"] for r in prof_rounds) / steps * 1e3
    res["median_ms"] = {m: v["ms_per_step"] for m, v in res["modes"].items()}
    res["call_costs_us"] = costs
    res["cells"] = {"gpunb": gpunb_rounds, "torch.profiler": prof_rounds}
    return res


def print_table(results: list[dict], meta: dict) -> None:
    print(f"profile overhead · {meta['device']} · torch {meta['torch']} · {meta['date']}")
    print("overhead: median of per-round paired ratios [min .. max]; per-step µs from the cell body; "
          "fixed ms = enter + exit")
    print(f"{'loop':<14} {'mode':<15} {'ms/step':>8} {'overhead %':>11} {'[min .. max]':>17} "
          f"{'µs/step':>8} {'fixed ms':>9}")
    for res in results:
        head = f"{res['loop']} · {res['steps_per_cell']} steps/cell · {res['cell_s']:.2f} s/cell · " \
               f"{res['rounds']} rounds (+{res['profiler_rounds']} torch.profiler rounds)"
        print(head)
        for m, v in res["modes"].items():
            if m == "none":
                print(f"{res['loop']:<14} {m:<15} {v['ms_per_step']:>8.3f}")
                continue
            mark = ""
            if m in TARGETS:
                mark = "  ok" if v["overhead_pct"] < TARGETS[m] else f"  over the {TARGETS[m]}% target"
            spread = f"[{v['overhead_pct_min']:+.2f} .. {v['overhead_pct_max']:+.2f}]"
            print(f"{res['loop']:<14} {m:<15} {v['ms_per_step']:>8.3f} {v['overhead_pct']:>+10.2f}% {spread:>17} "
                  f"{v['per_step_us']:>+8.1f} {v['fixed_ms']:>9.2f}{mark}")
        if "none_after_torch_profiler_ms_per_step" in res:
            print(f"{'':<14} (no profiler, after torch.profiler ran: "
                  f"{res['none_after_torch_profiler_ms_per_step']:.3f} ms/step)")
    print("\nper-call costs on this machine (µs, median)")
    names = list(dict.fromkeys(k for res in results for k in res["call_costs_us"]))
    for name in names:
        vals = [res["call_costs_us"].get(name) for res in results]
        cells = "  ".join(f"{v:>10.2f}" if v is not None else f"{'-':>10}" for v in vals)
        print(f"  {name:<58} {cells}")
    print(f"  {'(columns: ' + ', '.join(r['loop'] for r in results) + ')':<58}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for profile_overhead.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees a GPU")
    ap.add_argument("--cell-s", type=float, default=None, help="seconds per measured cell (default 2 on CUDA, 0.2 on CPU)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the gpunb variants (default 5, 3 on CPU)")
    ap.add_argument("--profiler-rounds", type=int, default=None,
                    help="rounds of torch.profiler vs none (default 2, 1 on CPU; 0 skips it)")
    ap.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="which loops (default both)")
    ap.add_argument("--loop", choices=LOOPS, help=argparse.SUPPRESS)  # child process: one loop
    ap.add_argument("--json", help=argparse.SUPPRESS)  # child process: write its result here
    args = ap.parse_args(argv)
    if args.loop:  # the child: one loop in a fresh process
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            print("profile_overhead: --device cuda but torch sees no CUDA GPU; use --device cpu", file=sys.stderr)
            return 2
        cuda = device == "cuda"
        cell_s = args.cell_s if args.cell_s is not None else (2.0 if cuda else 0.2)
        rounds = args.rounds if args.rounds is not None else (5 if cuda else 3)
        profiler_rounds = args.profiler_rounds if args.profiler_rounds is not None else (2 if cuda else 1)
        if rounds < 1 or profiler_rounds < 0 or cell_s <= 0:
            print("profile_overhead: --rounds must be >= 1, --profiler-rounds >= 0, --cell-s > 0", file=sys.stderr)
            return 2
        res = measure(args.loop, device, cell_s, rounds, profiler_rounds)
        import gpunb

        res["meta"] = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
                       "torch": torch.__version__, "python": platform.python_version(), "gpunb": gpunb.__version__,
                       "cell_s": cell_s}
        Path(args.json).write_text(json.dumps(res))
        return 0
    if not args.out:
        ap.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
              if k in ("device", "cell_s", "rounds", "profiler_rounds") and v is not None]
    for kind in args.loops:  # the parent never imports torch: each loop gets a fresh process
        part = out / f".profile_overhead_{kind}.json"
        done = subprocess.run([sys.executable, __file__, "--loop", kind, "--json", str(part), *passed])
        if done.returncode != 0:
            print(f"profile_overhead: the {kind} run failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode or 1
        results.append(json.loads(part.read_text()))
        part.unlink()
    meta = dict(results[0].pop("meta"))
    for res in results[1:]:
        res.pop("meta", None)
    meta["date"] = time.strftime("%Y-%m-%d %H:%M")
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    print_table(results, meta)
    (out / "profile_overhead.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"written: {out / 'profile_overhead.json'} ({meta['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
