"""What profiling a cell costs: no profiler vs ``%%gpuprofile`` (its API twin
``gpunb.profile()``, the same machinery) vs ``%gpuprofile on`` (the per-cell meter the
one-line mode runs in pre/post_run_cell) vs ``torch.profiler.profile()`` with defaults.

Two loops, each in its own fresh process (torch.profiler leaves CUPTI attached, and one
loop's allocator state must not leak into the other):

- launch-bound: an 8-layer 1024-wide MLP, batch 64, AdamW (the monitor benchmark's small
  loop, ~2.3 ms/step on an H200: host-bound, so per-step hook costs show in full);
- compute-bound: four bf16 8192x8192 layers (GPU-bound: host costs hide behind the GPU).

Every variant does identical work: the same model, optimizer and input tensors (made once,
on the device, before any timing), one synchronize at the end of the cell's work, then the
profiler's exit. A cell's overhead has two parts, measured apart because they scale apart:

1. **per step** (the hooks inside the cell): many short blocks (``--block-s``, 0.1 s on a
   GPU), each variant once per round in a shuffled order, the body of each block timed
   between the profiler's enter and exit. Per round: (variant body - no-profiler body) /
   steps; the estimate is the median over rounds with a 95 % bootstrap interval. Short
   blocks next to each other share the machine's slow drift (a VM's step time wanders by
   10-20 % over seconds, which buried a 1 % effect in whole-cell comparisons), so it cancels
   in each pair. Extra variants split the cost by instrument: the step hook with its CUDA
   events alone, the Tensor sync wrappers alone.
2. **per cell** (enter + exit: resets, NVML reads, event read-back, building the report),
   timed around those calls in whole cells of ``--cell-s`` (2 s on a GPU).

Overhead of a cell of T seconds = per-step µs / step time + per-cell ms / T; the table gives
it for the benchmark's cell length. As a cross-check the whole cells are also compared
directly (rounds with rotated order, median of paired ratios [min .. max]); torch.profiler
only this way, in a second phase, so whatever it leaves attached cannot slow the others.
Then a table of per-call costs on this machine (allocator reads, NVML calls, /proc reads).

    python benchmarks/profile_overhead.py --out DIR [--cpus 4-7]   # ~5 min on an H200
    python benchmarks/profile_overhead.py --out DIR --device cpu    # CPU smoke run (tiny sizes)

``--cpus`` pins the measuring process (and the threads torch starts) to those cores; it
lowers the noise of a host-bound loop on a VM and acts on every variant alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOOPS = ("launch-bound", "compute-bound")
GPUNB_MODES = ("none", "gpuprofile", "one-line")
# single instruments, in the per-step blocks only; the second records an event at every step
# (step_events.MIN_GAP_S = 0), to price what the adaptive spacing of events saves
PARTS = ("step hook + events", "step hook + event every step", "sync wrappers")
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

    def run(steps: int, marks: list | None = None) -> None:
        for _ in range(steps):
            loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if marks is not None:
                marks.append(time.perf_counter())

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


@contextlib.contextmanager
def one_instrument(part: str):
    """One of %%gpuprofile's instruments alone, installed and removed as a profiled cell does."""
    import torch

    from gpunb.analysis.instruments import Instruments

    from gpunb.analysis import step_events

    ins = Instruments(torch, memory_every_s=None)
    gap = step_events.MIN_GAP_S
    if part.startswith("step hook"):
        if torch.cuda.is_available():
            ins.start_event = torch.cuda.Event(enable_timing=True)
            ins.start_event.record()
        ins._hook_optimizer(torch)
        if part == "step hook + event every step":
            step_events.MIN_GAP_S = 0.0
    else:
        ins._wrap_tensor_syncs(torch)
    try:
        yield
    finally:
        ins.remove()
        ins.finish_steps()
        step_events.MIN_GAP_S = gap


def context(mode: str):
    import torch

    import gpunb

    if mode == "none":
        return contextlib.nullcontext()
    if mode == "gpuprofile":
        return gpunb.profile(record=False, show=False)
    if mode == "one-line":
        return one_line()
    if mode in PARTS:
        return one_instrument(mode)
    return torch.profiler.profile()


CAP_S = 0.001  # a host step longer than the block's median + 1 ms is a stall of the machine


def cell(mode: str, run, steps: int, device: str, collect: bool = True, marks: bool = False) -> dict:
    """One cell: enter, the steps, one synchronize, exit; each part timed. With ``marks``,
    also the body with each host step capped at the block's median + ``CAP_S``: every
    per-step cost of the profiler is far below 1 ms (the per-call table), while a VM's
    stalls of several ms land in one block and not its pair (valid for host-bound loops,
    where a host step is a loop step)."""
    if collect:
        gc.collect()
    sync(device)
    stamps: list | None = [] if marks else None
    t0 = time.perf_counter()
    ctx = context(mode)
    ctx.__enter__()
    gc.disable()  # a collection landing in one variant's cell and not the other's is noise
    try:
        c1 = time.thread_time()
        t1 = time.perf_counter()
        run(steps, stamps)
        sync(device)
        t2 = time.perf_counter()
        c2 = time.thread_time()
    finally:
        gc.enable()
    ctx.__exit__(None, None, None)
    t3 = time.perf_counter()
    out = {"total_s": t3 - t0, "enter_s": t1 - t0, "body_s": t2 - t1, "exit_s": t3 - t2, "thread_cpu_s": c2 - c1}
    if stamps:
        steps_s = [b - a for a, b in zip([t1] + stamps, stamps)]
        cap = statistics.median(steps_s) + CAP_S
        out["capped_body_s"] = sum(min(d, cap) for d in steps_s) + (t2 - stamps[-1])
        out["capped_steps"] = sum(d > cap for d in steps_s)
    return out


def rounds_of(modes: tuple[str, ...], n: int, run, steps: int, device: str) -> list[dict]:
    """Whole cells, order rotated each round."""
    out = []
    for r in range(n):
        k = r % len(modes)
        order = modes[k:] + modes[:k]
        out.append({m: cell(m, run, steps, device) for m in order})
    return out


def blocks_of(modes: tuple[str, ...], budget_s: float, run, steps: int, device: str, seed: int = 0) -> list[dict]:
    """Short blocks, every mode once per round in a shuffled order, until ``budget_s`` is spent."""
    rng = random.Random(seed)
    out: list[dict] = []
    t_end = time.perf_counter() + budget_s
    while time.perf_counter() < t_end or len(out) < 3:
        order = list(modes)
        rng.shuffle(order)
        gc.collect()
        out.append({m: cell(m, run, steps, device, collect=False, marks=True) for m in order})
    return out


def median_ci(values: list[float], resamples: int = 2000, seed: int = 1) -> tuple[float, float, float]:
    """Median and its 95 % percentile-bootstrap interval."""
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return statistics.median(values), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def per_step(blocks: list[dict], mode: str, steps: int, key: str = "body_s") -> dict:
    diffs = [(r[mode][key] - r["none"][key]) / steps * 1e6 for r in blocks]
    med, lo, hi = median_ci(diffs)
    return {"per_step_us": med, "per_step_us_ci": [lo, hi], "blocks": len(blocks)}


def robust_per_step(blocks: list[dict], mode: str, steps: int) -> dict:
    """The same from capped host steps, with how often a step was capped in each variant."""
    got = per_step(blocks, mode, steps, "capped_body_s")
    n = len(blocks) * steps / 1000
    return {"capped_per_step_us": got["per_step_us"], "capped_per_step_us_ci": got["per_step_us_ci"],
            "capped_per_1000_steps": sum(r[mode]["capped_steps"] for r in blocks) / n,
            "capped_per_1000_steps_none": sum(r["none"]["capped_steps"] for r in blocks) / n,
            "thread_cpu_per_step_us": per_step(blocks, mode, steps, "thread_cpu_s")["per_step_us"]}


def direct(rounds: list[dict], mode: str, steps: int) -> dict:
    ratios = [r[mode]["total_s"] / r["none"]["total_s"] for r in rounds]
    return {
        "direct_pct": 100 * (statistics.median(ratios) - 1),
        "direct_pct_min": 100 * (min(ratios) - 1),
        "direct_pct_max": 100 * (max(ratios) - 1),
        "fixed_ms": statistics.median((r[mode]["enter_s"] + r[mode]["exit_s"]) * 1e3 for r in rounds),
        "enter_ms": statistics.median(r[mode]["enter_s"] * 1e3 for r in rounds),
        "exit_ms": statistics.median(r[mode]["exit_s"] * 1e3 for r in rounds),
        "ms_per_step": statistics.median(r[mode]["total_s"] / steps * 1e3 for r in rounds),
    }


def overhead_pct(per_step_us: float, step_ms: float, fixed_ms: float, cell_s: float) -> float:
    """% of a cell of ``cell_s`` seconds: the per-step part plus the per-cell part."""
    return 100 * (per_step_us / (step_ms * 1e3) + fixed_ms / (cell_s * 1e3))


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
        from gpunb.analysis.step_events import StepEvents

        events = StepEvents(torch, dev, min_gap_s=0.0)
        costs["StepEvents.step, an event each (pooled, C record, read-back)"] = per_call_us(
            lambda: events.step(1, time.perf_counter()), max_n=4000)
        events.finish()
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
def exit_breakdown(mode: str, run, steps: int, device: str) -> list[list]:
    """Where a profiler's exit spends its time: the ten costliest calls by cumulative ms."""
    import cProfile
    import pstats

    ctx = context(mode)
    ctx.__enter__()
    run(steps)
    sync(device)
    prof = cProfile.Profile()
    prof.enable()
    ctx.__exit__(None, None, None)
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][3])[:10]
    return [[f"{Path(f).name}:{line}({name})", round(v[3] * 1e3, 3)] for (f, line, name), v in rows]


def measure(kind: str, device: str, cell_s: float, rounds: int, profiler_rounds: int,
            block_s: float, block_budget_s: float) -> dict:
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
    block_steps = max(3, round(block_s / step_s))
    costs = call_costs(device, opt)
    blocks = blocks_of(GPUNB_MODES + PARTS, block_budget_s, run, block_steps, device)
    cells = rounds_of(GPUNB_MODES, rounds, run, steps, device)
    prof_rounds = rounds_of(("none", "torch.profiler"), profiler_rounds, run, steps, device) if profiler_rounds else []
    step_ms = statistics.median(r["none"]["body_s"] for r in blocks) / block_steps * 1e3
    none_ms = statistics.median(r["none"]["total_s"] for r in cells) / steps * 1e3
    res = {"loop": kind, "steps_per_cell": steps, "rounds": rounds, "profiler_rounds": profiler_rounds,
           "steps_per_block": block_steps, "block_rounds": len(blocks),
           "cell_s": none_ms * steps / 1e3, "step_ms": step_ms, "modes": {"none": {"ms_per_step": none_ms}}}
    for m in GPUNB_MODES[1:]:
        v = {**per_step(blocks, m, block_steps), **robust_per_step(blocks, m, block_steps), **direct(cells, m, steps)}
        for k in ("", "capped_"):
            lo, hi = v[f"{k}per_step_us_ci"]
            v[f"{k}overhead_pct"] = overhead_pct(v[f"{k}per_step_us"], step_ms, v["fixed_ms"], res["cell_s"])
            v[f"{k}overhead_pct_ci"] = [overhead_pct(lo, step_ms, v["fixed_ms"], res["cell_s"]),
                                        overhead_pct(hi, step_ms, v["fixed_ms"], res["cell_s"])]
        res["modes"][m] = v
    if prof_rounds:
        res["modes"]["torch.profiler"] = direct(prof_rounds, "torch.profiler", steps)
        # its own paired no-profiler cells, after the profiler ran: CUPTI left attached shows here
        res["none_after_torch_profiler_ms_per_step"] = statistics.median(
            r["none"]["total_s"] for r in prof_rounds) / steps * 1e3
    res["parts"] = {p: {**per_step(blocks, p, block_steps), **robust_per_step(blocks, p, block_steps)} for p in PARTS}
    res["median_ms"] = {m: v["ms_per_step"] for m, v in res["modes"].items()}
    res["call_costs_us"] = costs
    # a cell long enough for the one-line mode's NVML utilization read (cell_meter.UTIL_MIN_S)
    res["exit_breakdown_ms"] = {m: exit_breakdown(m, run, steps, device) for m in GPUNB_MODES[1:]}
    res["cells"] = {"gpunb": cells, "torch.profiler": prof_rounds, "blocks": blocks}
    return res


def print_table(results: list[dict], meta: dict) -> None:
    print(f"profile overhead · {meta['device']} · torch {meta['torch']} · {meta['date']}"
          + (f" · pinned to CPUs {meta['cpus']}" if meta.get("cpus") else ""))
    print("overhead % of a cell = per-step µs / step time + per-cell ms / cell length; per step: median of paired "
          "short blocks [95 % bootstrap]; direct: whole cells, median paired ratio [min .. max]")
    for res in results:
        host_bound = res["loop"] == "launch-bound"
        print(f"\n{res['loop']} · {res['step_ms']:.3f} ms/step · {res['cell_s']:.2f} s cells "
              f"({res['steps_per_cell']} steps) · {res['block_rounds']} block rounds of {res['steps_per_block']} steps · "
              f"{res['rounds']} whole-cell rounds (+{res['profiler_rounds']} torch.profiler)")
        print(f"  {'mode':<30} {'per step µs':>24} {'capped steps µs':>24} {'per cell ms':>11} {'overhead %':>26} "
              f"{'from capped steps':>26} {'direct whole cells %':>28}")
        rows = [(m, v) for m, v in res["modes"].items() if m != "none"] + [(f"· {p}", v) for p, v in res["parts"].items()]
        for m, v in rows:
            ci = lambda key: f"{v[key]:+.2f} [{v[key + '_ci'][0]:+.2f} .. {v[key + '_ci'][1]:+.2f}]"  # noqa: E731
            step = ci("per_step_us") if "per_step_us" in v else ""
            capped = ci("capped_per_step_us") if "capped_per_step_us" in v else ""
            fixed = f"{v['fixed_ms']:.2f}" if "fixed_ms" in v else ""
            pct = ci("overhead_pct") if "overhead_pct" in v else ""
            cpct = ci("capped_overhead_pct") if "capped_overhead_pct" in v else ""
            spread = (f"{v['direct_pct']:+.2f} [{v['direct_pct_min']:+.2f} .. {v['direct_pct_max']:+.2f}]"
                      if "direct_pct" in v else "")
            mark = ""
            if m in TARGETS:
                judged = v["capped_overhead_pct" if host_bound else "overhead_pct"]
                mark = "  ok" if judged < TARGETS[m] else f"  over the {TARGETS[m]} % target"
            print(f"  {m:<30} {step:>24} {capped:>24} {fixed:>11} {pct:>26} {cpct:>26} {spread:>28}{mark}")
        v = res["modes"]["gpuprofile"]
        print(f"  steps capped per 1000: none {v['capped_per_1000_steps_none']:.1f}, "
              + ", ".join(f"{m} {x['capped_per_1000_steps']:.1f}" for m, x in rows if "capped_per_1000_steps" in x)
              + f" · target judged on {'capped steps (host-bound loop)' if host_bound else 'whole blocks'}")
        if "none_after_torch_profiler_ms_per_step" in res:
            print(f"  (no profiler, after torch.profiler ran: {res['none_after_torch_profiler_ms_per_step']:.3f} ms/step)")
        for m, rows_ in res["exit_breakdown_ms"].items():
            print(f"  {m} exit, costliest calls (cumulative ms): " + "; ".join(f"{n} {ms:.2f}" for n, ms in rows_[:7]))
    print("\nper-call costs on this machine (µs, median)")
    names = list(dict.fromkeys(k for res in results for k in res["call_costs_us"]))
    for name in names:
        vals = [res["call_costs_us"].get(name) for res in results]
        cells = "  ".join(f"{v:>10.2f}" if v is not None else f"{'-':>10}" for v in vals)
        print(f"  {name:<58} {cells}")
    print(f"  {'(columns: ' + ', '.join(r['loop'] for r in results) + ')':<58}")


def parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for profile_overhead.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees a GPU")
    ap.add_argument("--cell-s", type=float, default=None, help="seconds per whole cell (default 2 on CUDA, 0.2 on CPU)")
    ap.add_argument("--rounds", type=int, default=None, help="whole-cell rounds of the gpunb variants (default 6, 2 on CPU)")
    ap.add_argument("--profiler-rounds", type=int, default=None,
                    help="rounds of torch.profiler vs none (default 2, 1 on CPU; 0 skips it)")
    ap.add_argument("--block-s", type=float, default=None, help="seconds per short block (default 0.1, 0.02 on CPU)")
    ap.add_argument("--block-budget-s", type=float, default=None,
                    help="seconds of short blocks per loop (default 90, 2 on CPU)")
    ap.add_argument("--cpus", help="pin the measuring processes to these cores, e.g. 4-7 or 2,3")
    ap.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="which loops (default both)")
    ap.add_argument("--loop", choices=LOOPS, help=argparse.SUPPRESS)  # child process: one loop
    ap.add_argument("--json", help=argparse.SUPPRESS)  # child process: write its result here
    args = ap.parse_args(argv)
    cpus = None
    if args.cpus:
        try:
            cpus = parse_cpus(args.cpus)
            os.sched_setaffinity(0, cpus)  # before torch starts threads: they inherit it
        except (ValueError, OSError) as exc:
            print(f"profile_overhead: cannot pin to CPUs {args.cpus!r} ({exc}); "
                  f"this machine has {os.cpu_count()}", file=sys.stderr)
            return 2
    if args.loop:  # the child: one loop in a fresh process
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            print("profile_overhead: --device cuda but torch sees no CUDA GPU; use --device cpu", file=sys.stderr)
            return 2
        cuda = device == "cuda"
        pick = lambda value, gpu, cpu: value if value is not None else (gpu if cuda else cpu)  # noqa: E731
        cell_s = pick(args.cell_s, 2.0, 0.2)
        rounds = pick(args.rounds, 6, 2)
        profiler_rounds = pick(args.profiler_rounds, 2, 1)
        block_s = pick(args.block_s, 0.1, 0.02)
        block_budget_s = pick(args.block_budget_s, 90.0, 2.0)
        if rounds < 1 or profiler_rounds < 0 or min(cell_s, block_s, block_budget_s) <= 0:
            print("profile_overhead: --rounds must be >= 1, --profiler-rounds >= 0, and the times > 0",
                  file=sys.stderr)
            return 2
        res = measure(args.loop, device, cell_s, rounds, profiler_rounds, block_s, block_budget_s)
        import gpunb

        res["meta"] = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
                       "torch": torch.__version__, "python": platform.python_version(), "gpunb": gpunb.__version__,
                       "cell_s": cell_s, "cpus": args.cpus, "cpu_count": os.cpu_count()}
        Path(args.json).write_text(json.dumps(res))
        return 0
    if not args.out:
        ap.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
              if k in ("device", "cell_s", "rounds", "profiler_rounds", "block_s", "block_budget_s", "cpus")
              and v is not None]
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
