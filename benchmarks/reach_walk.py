"""The shared walk (gpunb/analysis/reach.py) measured three ways, side by side in one run:

1. the leak finder's recall on the generated leak space and its false alarms on the bounded one
   (``tests/object_graphs.py``: random chains of every holder around a list, deque, set or dict
   that gains a 64 KiB tensor a step, or a tensor that grows by ``torch.cat``; their bounded
   twins), each graph under the finder's looks at every 4th step of 40 (target: recall >= 95 %,
   no false alarm);
2. the leak finder's cost as ``benchmarks/profile_overhead.py`` measures it (its
   ``leak_finder_cost``: whole cells with ``leak`` on and off in alternating order, and the
   censuses timed in place as a share of the cell; the budget is 0.5 %);
3. ``%gpumem``'s time (``gpunb.memory(namespace=...)``, the census and the report) on a notebook
   holding 100,000 objects (target: <= 1 s), beside the same call on an empty notebook.

    python benchmarks/reach_walk.py --out DIR              # ~1 min on the CPU
    python benchmarks/reach_walk.py --out DIR --graphs 50  # fewer generated graphs
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]


def recall(graphs: int, seed: int) -> dict:
    from tests import object_graphs as og
    from tests.test_reach_properties import LEAK_KINDS, _bounded, _leaky, leak_found, run_finder

    rng = random.Random(seed)

    def choose(options):
        return rng.choice(list(options))

    found = missed = alarms = 0
    misses: list[str] = []
    false_alarms: list[str] = []
    for i in range(graphs):
        kind = LEAK_KINDS[i % len(LEAK_KINDS)]
        holder, step = _leaky(kind)
        ns, kinds = og.namespace(choose, {"grower": holder})
        if leak_found(ns, holder, run_finder(ns, step)):
            found += 1
        else:
            missed += 1
            misses.append(f"{kind} in {kinds['grower']}")
        holder, step = _bounded(kind)
        ns, kinds = og.namespace(choose, {"grower": holder})
        report = run_finder(ns, step)
        if report.findings:
            alarms += 1
            false_alarms.append(f"{kind} in {kinds['grower']}: {report.findings[0].sentence}")
    return {"leak_graphs": graphs, "found": found, "recall_pct": 100 * found / graphs, "misses": misses[:10],
            "bounded_graphs": graphs, "false_alarms": alarms, "false_alarm_examples": false_alarms[:10]}


def finder_cost(rounds: int, steps: int) -> dict:
    from profile_overhead import leak_finder_cost
    from training_loops import LOOPS, build_loop

    out = {}
    for name in LOOPS:
        out[name] = leak_finder_cost(build_loop(name, "cpu"), "cpu", steps, rounds)
    return out


def gpumem_time(objects: int, repeats: int) -> dict:
    import torch

    import gpunb

    class Record:
        def __init__(self, i: int) -> None:
            self.i = i
            self.tags = {"id": i}

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    # 100,000 objects in containers the walk reads whole (10,000 elements each at most):
    # 25,000 records with a dict each, 25,000 tensors, 25,000 dicts of logged values
    per = 2_500
    big: dict = {"model": model, "opt": torch.optim.AdamW(model.parameters())}
    for k in range(objects // 4 // per):
        big[f"records{k}"] = [Record(i) for i in range(per)]
        big[f"batches{k}"] = [torch.zeros(8) for _ in range(per)]
        big[f"log{k}"] = [{"step": i, "loss": float(i)} for i in range(per)]
    from gpunb.analysis.memory.census import take_census

    census = take_census(big, torch=torch)
    walked = {"tensors_named": len(census.entries), "truncated": census.truncated}
    empty: dict = {}

    def timed(ns: dict) -> list[float]:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            gpunb.memory(namespace=ns)
            times.append(time.perf_counter() - t0)
        return times

    timed(empty)  # imports, first NVML look
    full, none = [], []
    for r in range(repeats):  # alternating, so a busy moment of the machine hits both
        for which in (("full", "none") if r % 2 == 0 else ("none", "full")):
            (full if which == "full" else none).extend(timed(big if which == "full" else empty)[:1])
    return {"objects": objects, "repeats": repeats, **walked, "median_s": statistics.median(full), "max_s": max(full),
            "empty_median_s": statistics.median(none)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for reach_walk.json")
    ap.add_argument("--graphs", type=int, default=200, help="generated leak graphs (and as many bounded ones)")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--rounds", type=int, default=4, help="leak-finder cost rounds per loop")
    ap.add_argument("--steps", type=int, default=200, help="steps per leak-finder cost cell")
    ap.add_argument("--objects", type=int, default=100_000)
    args = ap.parse_args(argv)
    import os

    os.environ.setdefault("GPUNB_FAKE_NVML", "no-driver")  # %gpumem without a GPU here: the census is what is timed
    result = {
        "machine": f"{os.cpu_count()} CPUs, {sys.platform}",
        "date": time.strftime("%Y-%m-%d"),
        "recall": recall(args.graphs, args.seed),
        "gpumem": gpumem_time(args.objects, 5),
        "leak_finder_cost": finder_cost(args.rounds, args.steps) if args.rounds else {},
    }
    r, g = result["recall"], result["gpumem"]
    lines = [f"leak finder recall {r['recall_pct']:.1f} % ({r['found']}/{r['leak_graphs']} generated leaks), "
             f"{r['false_alarms']} false alarms on {r['bounded_graphs']} bounded graphs",
             f"%gpumem on {g['objects']:,} objects: median {g['median_s'] * 1000:.0f} ms (max "
             f"{g['max_s'] * 1000:.0f} ms; empty notebook {g['empty_median_s'] * 1000:.0f} ms; "
             f"{g['tensors_named']:,} tensors named, walk {'truncated' if g['truncated'] else 'complete'})"]
    for name, c in result["leak_finder_cost"].items():
        share = c["finder_share_pct"]
        top = c["finder_share_pct_max"]
        lines.append(f"leak finder on {name}: censuses {share:.3f} % of the cell (max {top:.3f} %)"
                     f" in place; whole cells {c['direct_pct']:+.1f} % [{c['direct_pct_min']:+.1f} .. "
                     f"{c['direct_pct_max']:+.1f}]; false findings {len(c['false_findings'])}"
                     if share is not None else f"leak finder on {name}: no look fitted")
    print("\n".join(lines))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "reach_walk.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
