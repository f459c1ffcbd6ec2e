"""How close ``%gpuplan`` comes to the GPU, planned on this CPU: the peak, the largest batch, the time.

1. **Peak**: every (model, batch) that ``plan_calibration_record.py`` measured on a GPU
   (``results/h200_s5_plan_calibration.json``, else ``h200_s5_plan_calibration_run32.json``) is
   planned here, on stand-in tensors, and the plan's ``max_memory_allocated`` of the first step and
   of the steady steps is compared with the GPU's. Goal: median |error| <= 5 %, worst <= 10 %,
   no under-estimate beyond 3 %.
2. **Largest batch**: for each model of the batch-fit zoo, the largest batch planned to fit its
   cap (``set_per_process_memory_fraction``) against the largest that trained 50 steps in a fresh
   process on the H200 (``results/h200x2_batch_fit_zoo_run1.json``). Goal: never above.
3. **Time**: ``gpunb.plan(step, 64)`` (with its default GPUs) for ResNet-50, ViT-B/16 and
   GPT-2 small on this machine. Goal: under 10 s each.

    python benchmarks/plan_accuracy.py [--calibration PATH] [--out results/plan_accuracy_cpu.json]
        [--models a,b] [--skip-time]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

CALIBRATION = HERE / "results" / "h200_s5_plan_calibration.json"  # the lead's recording
MINE = HERE / "results" / "h200_s5_plan_calibration_run32.json"  # the same script, run for issue 32
ZOO_TRUTH = HERE / "results" / "h200x2_batch_fit_zoo_run1.json"
TIMED = ("resnet50", "vit_b16", "gpt2_small")
BENCHMARK_MODE = {"conv_bn"}  # models that set torch.backends.cudnn.benchmark


def _fresh(torch: Any) -> None:
    """What a fresh process starts with (the recording runs each model in one): a model that sets
    ``cudnn.benchmark`` must not leave it set for the next."""
    torch.backends.cudnn.benchmark = False


def _planned(torch: Any, name: str, batch: int) -> dict[str, Any]:
    import plan_zoo

    from gpunb.analysis.fit.user_state import find_reachable
    from gpunb.analysis.plan import calibration
    from gpunb.analysis.plan.dry_run import dry_run
    from gpunb.analysis.plan.replay import replay

    _fresh(torch)
    model = plan_zoo.build(name, "cpu")
    t0 = time.perf_counter()
    rec = dry_run(torch, model.step, batch, find_reachable(torch, model.step))
    r = replay(rec, workspaces=calibration.WORKSPACES)
    return {"before": r.before_bytes, "step1": r.first_allocated, "steady": r.steady_allocated,
            "step1_reserved": r.first_reserved, "steady_reserved": r.steady_reserved,
            "seconds": round(time.perf_counter() - t0, 2), "runs": len(rec.marks)}


def _err(planned: int, measured: int | None) -> float | None:
    return None if not measured else (planned - measured) / measured


def peaks(torch: Any, calibration_path: Path, models: set[str]) -> list[dict[str, Any]]:
    data = json.loads(calibration_path.read_text())
    rows = []
    for rec in data.get("records", []):
        if rec.get("kind") != "step" or "steady_peak_allocated" not in rec:
            continue
        if models and rec["model"] not in models:
            continue
        p = _planned(torch, rec["model"], rec["batch"])
        rows.append({"model": rec["model"], "batch": rec["batch"],
                     "measured_weights": rec.get("weights_bytes"), "planned_before": p["before"],
                     "measured_step1": rec["step1_peak_allocated"], "planned_step1": p["step1"],
                     "measured_steady": rec["steady_peak_allocated"], "planned_steady": p["steady"],
                     "measured_steady_reserved": rec.get("steady_peak_reserved"),
                     "planned_steady_reserved": p["steady_reserved"],
                     "err_step1": _err(p["step1"], rec["step1_peak_allocated"]),
                     "err_steady": _err(p["steady"], rec["steady_peak_allocated"]),
                     "err_peak": _err(max(p["step1"], p["steady"]),
                                      max(rec["step1_peak_allocated"], rec["steady_peak_allocated"])),
                     "plan_seconds": p["seconds"], "runs": p["runs"]})
        print(f"{rec['model']:>12} {rec['batch']:>6}  steady {rows[-1]['err_steady']:+.2%}  "
              f"step1 {rows[-1]['err_step1']:+.2%}", flush=True)
    return rows


def largest(torch: Any, models: set[str]) -> list[dict[str, Any]]:
    import memory_zoo
    import plan_zoo

    from gpunb.analysis.plan.gpus import with_cap
    from gpunb.analysis.plan.planner import plan

    truth = json.loads(ZOO_TRUTH.read_text())
    rows = []
    for entry in truth["models"]:
        name = entry["model"]
        if models and name not in models:
            continue
        cap = int(entry["cap_bytes"])
        _fresh(torch)
        model = plan_zoo.build(name, "cpu")
        start = plan_zoo.BATCHES[name][0]
        t0 = time.perf_counter()
        result = plan(model.step, start, gpu_list=[with_cap(f"{memory_zoo.ZOO[name].cap_gib:g} GiB cap", cap)])
        answer = result.gpus[0].largest_batch if result.gpus else None
        measured = entry["truth"]["max"]
        rows.append({"model": name, "cap_bytes": cap, "measured_max": measured, "planned_max": answer,
                     "share": answer / measured if answer else None, "problem": result.problem,
                     "seconds": round(time.perf_counter() - t0, 2)})
        print(f"{name:>12} cap {cap / 2**30:g} GiB: planned {answer}, trained {measured}", flush=True)
    return rows


def timing(torch: Any) -> list[dict[str, Any]]:
    import plan_zoo

    from gpunb.analysis.plan.planner import plan

    rows = []
    for name in TIMED:
        _fresh(torch)
        model = plan_zoo.build(name, "cpu")
        t0 = time.perf_counter()
        result = plan(model.step, 64)
        rows.append({"model": name, "batch": 64, "seconds": round(time.perf_counter() - t0, 2),
                     "problem": result.problem, "headline": result.headline})
        print(f"{name:>12} batch 64: {rows[-1]['seconds']} s  {result.headline}", flush=True)
    return rows


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    errs = [r[key] for r in rows if r[key] is not None]
    if not errs:
        return {}
    return {"n": len(errs), "median_abs": statistics.median(abs(e) for e in errs), "worst_abs": max(map(abs, errs)),
            "worst_under": min(errs), "worst_over": max(errs), "under_3pct": sum(e < -0.03 for e in errs)}


def markdown(report: dict[str, Any]) -> str:
    out = ["| model | batch | measured steady | planned | error | measured step 1 | planned | error |",
           "|---|---|---|---|---|---|---|---|"]
    gib = 2**30
    for r in report["peaks"]:
        out.append(f"| {r['model']} | {r['batch']} | {r['measured_steady'] / gib:.3f} GiB | "
                   f"{r['planned_steady'] / gib:.3f} GiB | {r['err_steady']:+.1%} | "
                   f"{r['measured_step1'] / gib:.3f} GiB | "
                   f"{r['planned_step1'] / gib:.3f} GiB | {r['err_step1']:+.1%} |")
    for key in ("err_steady", "err_step1", "err_peak", "err_peak_without_benchmark_first_step"):
        s = report["summary"].get(key)
        if s:
            out.append(f"- {key}: median |error| {s['median_abs']:.1%}, worst {s['worst_abs']:.1%} "
                       f"(under {s['worst_under']:+.1%}, over {s['worst_over']:+.1%}), "
                       f"{s['under_3pct']} of {s['n']} under by more than 3 %")
    if report["largest"]:
        out += ["", "| model | cap | trained (H200) | planned | share |", "|---|---|---|---|---|"]
        for r in report["largest"]:
            share = f"{r['share']:.0%}" if r["share"] else "—"
            out.append(f"| {r['model']} | {r['cap_bytes'] / gib:g} GiB | {r['measured_max']} | "
                       f"{r['planned_max']} | {share} |")
    if report["timing"]:
        out += ["", "| model | batch | seconds on this CPU |", "|---|---|---|"]
        out += [f"| {r['model']} | {r['batch']} | {r['seconds']} |" for r in report["timing"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=str(CALIBRATION if CALIBRATION.exists() else MINE))
    ap.add_argument("--out", default=str(HERE / "results" / "plan_accuracy_cpu.json"))
    ap.add_argument("--models", default="")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--skip-largest", action="store_true")
    args = ap.parse_args(argv)
    import torch

    models = {m for m in args.models.split(",") if m}
    cal = Path(args.calibration)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                              "calibration": str(cal.relative_to(ROOT)) if cal.is_relative_to(ROOT) else str(cal),
                              "command": "python benchmarks/plan_accuracy.py " + " ".join(argv or sys.argv[1:])}
    report["peaks"] = peaks(torch, cal, models) if cal.exists() else []
    report["summary"] = {k: summary(report["peaks"], k) for k in ("err_steady", "err_step1", "err_peak")}
    # cuDNN's benchmark mode times algorithms in the first step with workspaces as large as the free
    # memory allows (conv_bn: twice the steady peak on an empty H200, adapting under a cap): apart
    plain = [r for r in report["peaks"] if r["model"] not in BENCHMARK_MODE]
    report["summary"]["err_peak_without_benchmark_first_step"] = summary(plain, "err_peak")
    report["largest"] = [] if args.skip_largest else largest(torch, models)
    report["timing"] = [] if args.skip_time else timing(torch)
    Path(args.out).write_text(json.dumps(report, indent=1))
    text = markdown(report)
    Path(args.out).with_suffix(".md").write_text(text + "\n")
    print(text)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
