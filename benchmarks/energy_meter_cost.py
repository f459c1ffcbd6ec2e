"""Why the energy meter cost a launch-bound loop +2.4 to +3.0 % (issue 23), and whether it still does.

``python3 benchmarks/energy_meter_cost.py --out DIR`` (about 4 min on one H200; ``--device cpu``
runs the code path only, without NVML).

The earlier figure came from 3 on/off pairs of 5 s cells, while the same loop's step time wanders
by ±10 % between runs on the H200 VM (``h200_s4_run2_monitor_overhead.json``: 2.49 to 2.96 ms
with nothing on). Here many short chunks are interleaved, in a new random order each round, and
each variant is compared with the plain loop *of the same round*: the median of those paired
ratios resolves a fraction of a percent where a median of 3 cells could not.

Each variant isolates one suspect, on the launch-bound loop of ``training_loops.py``:

- ``profile``: ``gpunb.profile(energy=False)``, the baseline the meter is added to;
- ``profile+energy``: ``gpunb.profile(energy=True)``, what a user pays;
- ``energy-no-polling``: the same with marks every 1 s read when asked, not polled for the
  counter's move (``meter.MARK_EVERY_S`` = 1, ``FRESH_WAIT_S`` = 0): the meter's worker then
  wakes 1 time a second instead of ~30;
- ``energy-no-pcie``: the same with its PCIe readings left out (``links.PCIE_EVERY_S`` = ∞);
- ``gil-wakeups``: a thread that wakes 40 times a second and runs a few µs of Python: the
  cost of handing the GIL to another thread, without NVML (the meter's worker wakes about
  this often while it waits for the counter to move);
- ``energy-reads-thread``: that thread reading the energy counter 40 times a second (pynvml,
  GIL released during the call): GIL hand-offs plus the driver's work;
- ``energy-reads-process``: the same reads from another process: the driver's work alone, no
  GIL (if this costs the loop, the reads themselves slow the GPU's launches);
- ``pcie-reads-thread``: a PCIe throughput read (both directions) every 0.5 s, as the meter does.

Writes ``DIR/energy_meter_cost.json`` and prints one line per variant: the median paired cost
and the middle half of the paired costs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

from training_loops import build_loop

WAKEUPS_PER_S = 40  # the meter's worker: a mark every 0.25 s, each polling every 8 ms until the counter moves
PCIE_EVERY_S = 0.5  # links.PCIE_EVERY_S
METERED = ("profile+energy", "energy-no-polling", "energy-no-pcie")  # compared with the profile without the meter


def _nvml_handle(index: int) -> tuple[Any, Any] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def _energy_read(nvml: tuple[Any, Any]) -> None:
    pynvml, handle = nvml
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)


def _pcie_read(nvml: tuple[Any, Any]) -> None:
    pynvml, handle = nvml
    pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)


def _python_work() -> None:
    sum(range(50))  # a few µs with the GIL held, as the worker's bookkeeping between reads


def _every(period_s: float, work: Callable[[], None], stop: threading.Event) -> None:
    while not stop.wait(period_s):
        work()


@contextmanager
def patched(module: Any, **values: float) -> Iterator[None]:
    """``module``'s constants set to ``values`` inside the block (read at each call, so a cell sees them)."""
    before = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)


@contextmanager
def profiled(energy: bool, **knobs: dict[str, float]) -> Iterator[None]:
    """A ``gpunb.profile`` block (no FLOP count, no leak finder, nothing shown) with the energy
    meter's ``knobs`` ({"meter": {...}, "links": {...}}) set."""
    import gpunb
    from gpunb.analysis.energy import links, meter

    with patched(meter, **knobs.get("meter", {})), patched(links, **knobs.get("links", {})), \
            gpunb.profile(record=False, show=False, flops=False, leak=False, energy=energy):
        yield


@contextmanager
def side_thread(period_s: float, work: Callable[[], None]) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=_every, args=(period_s, work, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _reader_process(index: int, period_s: float, ready: Any, stop: Any) -> None:
    nvml = _nvml_handle(index)
    ready.set()
    while nvml is not None and not stop.wait(period_s):
        _energy_read(nvml)


@contextmanager
def side_process(index: int, period_s: float) -> Iterator[None]:
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds a CUDA context
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_reader_process, args=(index, period_s, ready, stop), daemon=True)
    proc.start()
    ready.wait(60)
    try:
        yield
    finally:
        stop.set()
        proc.join(10)


def variants(nvml: tuple[Any, Any] | None, index: int) -> dict[str, Callable[[], Any]]:
    out: dict[str, Callable[[], Any]] = {
        "plain": nullcontext,
        "profile": lambda: profiled(False),
        "profile+energy": lambda: profiled(True),
        "energy-no-polling": lambda: profiled(True, meter={"MARK_EVERY_S": 1.0, "FRESH_WAIT_S": 0.0}),
        "energy-no-pcie": lambda: profiled(True, links={"PCIE_EVERY_S": float("inf")}),
        "gil-wakeups": lambda: side_thread(1 / WAKEUPS_PER_S, _python_work),
    }
    if nvml is not None:
        out["energy-reads-thread"] = lambda: side_thread(1 / WAKEUPS_PER_S, lambda: _energy_read(nvml))
        out["energy-reads-process"] = lambda: side_process(index, 1 / WAKEUPS_PER_S)
        out["pcie-reads-thread"] = lambda: side_thread(PCIE_EVERY_S, lambda: _pcie_read(nvml))
    return out


def chunk_step_s(loop: Any, steps: int, make: Callable[[], Any]) -> float:
    """Seconds per step of ``steps`` steps inside ``make()``'s context (its setup and end not timed)."""
    loop.sync()
    with make():
        time.sleep(0.05)  # a side process or thread is running before the clock starts
        t0 = time.perf_counter()
        loop.run(steps)
        loop.sync()
        t1 = time.perf_counter()
    return (t1 - t0) / steps


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def measure(device: str, chunk_s: float, rounds: int, index: int) -> dict[str, Any]:
    loop = build_loop("launch-bound", device)
    loop.run(20)
    loop.sync()
    t0 = time.perf_counter()
    loop.run(50)
    loop.sync()
    steps = max(20, int(chunk_s / ((time.perf_counter() - t0) / 50)))
    nvml = _nvml_handle(index) if device == "cuda" else None
    makers = variants(nvml, index)
    for make in makers.values():  # each variant once, untimed: imports and first calls
        chunk_step_s(loop, 20, make)
    step_s: dict[str, list[float]] = {name: [] for name in makers}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(makers)
        rng.shuffle(order)
        for name in order:
            step_s[name].append(chunk_step_s(loop, steps, makers[name]))
    out: dict[str, Any] = {"steps_per_chunk": steps, "rounds": rounds, "variants": {}}
    for name, times in step_s.items():
        base = "profile" if name in METERED else "plain"  # the meter is added to a profile
        paired = [t / b - 1.0 for t, b in zip(times, step_s[base])]
        lo, mid, hi = _quartiles(paired)
        out["variants"][name] = {"vs": base, "step_ms_median": statistics.median(times) * 1e3,
                                 "cost_median": mid, "cost_q1": lo, "cost_q3": hi,
                                 "step_ms": [t * 1e3 for t in times]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"))
    parser.add_argument("--chunk-s", type=float, default=1.0, help="seconds of training per chunk (GPU)")
    parser.add_argument("--rounds", type=int, default=25, help="rounds of every variant (GPU)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    chunk_s, rounds = (args.chunk_s, args.rounds) if device == "cuda" else (0.05, 3)  # CPU: the code path only
    index = 0
    if device == "cuda":
        from gpunb.readings.devices import read_device_map
        from gpunb.readings.nvml import default_session

        torch.cuda.init()
        found = read_device_map(default_session(), torch=torch).nvml_index(0)
        index = found if found is not None else 0
    result = measure(device, chunk_s, rounds, index)
    result.update(device=device, gpu=torch.cuda.get_device_name(0) if device == "cuda" else "",
                  measured_at=time.strftime("%Y-%m-%d %H:%M"), wakeups_per_s=WAKEUPS_PER_S,
                  pcie_every_s=PCIE_EVERY_S)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "energy_meter_cost.json").write_text(json.dumps(result, indent=1))
    print(f"launch-bound loop, {result['steps_per_chunk']} steps per chunk, {rounds} rounds on {device}")
    print(f"{'variant':22} {'vs':8} {'step ms':>8} {'cost':>8} {'middle half':>18}")
    for name, v in result["variants"].items():
        print(f"{name:22} {v['vs']:8} {v['step_ms_median']:8.3f} {v['cost_median'] * 100:+7.2f}% "
              f"{v['cost_q1'] * 100:+7.2f}% to {v['cost_q3'] * 100:+.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
