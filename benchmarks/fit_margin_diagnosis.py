"""Why %gpufit recommends what it does, term by term, against the fresh-process maximum (issue 24:
88 % of it on a BatchNorm conv net under a 20 GiB cap).

For each model (``memory_zoo.py``; default ``bn_convnet`` under 20 GiB and ``conv_bn`` under 6),
in fresh processes under the model's cap, all at once:

1. the quick same-process search, then the ground truth: the largest batch that trains the
   sustained run in a fresh process (``batch_fit_zoo.ground_truth``, parallel bisection);
2. %gpufit in a fresh process, and its answer's sustained run in another;
3. the curve the search extrapolates: one %gpufit trial alone in a fresh process at fractions
   of the quick search's maximum (every reading a trial takes).

Printed and written (``DIR/fit_margin_diagnosis.json``, ``.md``): each trial's readings; the
search's terms (the allocated line through the two largest trials that trained, where it fills
the cap, the overhead-scaled target, the first candidate's window, the verified batch, the
safety, the recommendation), each as a share of the fresh-process maximum; and the measured
curve against that line (growth per sample between measured batches).

    python benchmarks/fit_margin_diagnosis.py --out DIR          # one H200: under 3 min
    python benchmarks/fit_margin_diagnosis.py --smoke --out DIR  # the pipeline on the CPU twins
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import batch_fit_zoo  # noqa: E402

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit.records import Trial  # noqa: E402

GiB = 2**30
FRACTIONS = (0.05, 0.3, 0.6, 0.8, 0.95)  # of the quick search's maximum: the measured curve


def trial_from(d: dict) -> Trial:
    names = {f.name for f in dataclasses.fields(Trial)}
    return Trial(**{k: v for k, v in d.items() if k in names})


def terms(fit: dict, truth: int | None) -> dict[str, Any]:
    """The search's prediction, term by term, from the trials it recorded."""
    trials = [trial_from(t) for t in fit.get("trials", [])]
    cap = fit.get("capacity_bytes") or 0
    fitting = fit_search._fitting_trials(trials)
    _, line = fit_search.lines_from(trials)
    out: dict[str, Any] = {"capacity_gib": cap / GiB, "verified": fit.get("verified"),
                           "recommended": fit.get("recommended"), "safety": fit.get("safety"),
                           "predicted_first": fit.get("predicted"),
                           "predicted_reserved_first": fit.get("predicted_reserved")}
    if line is not None and fitting:
        full = line.largest_batch(cap)
        out.update({"line_intercept_gib": line.intercept / GiB, "line_slope_mib_per_sample": line.slope / 2**20,
                    "full": full, "reserved_target": fit_search.reserved_target(fitting, line, cap),
                    "overhead_at_largest": fit_search.overhead_ratio(fitting[-1]),
                    "first_aim": [fit_search.FIRST_AIM[0] * full, fit_search.FIRST_AIM[1] * full],
                    "reserved_bound": fit_search._reserved_bound_batch(fitting[-1], cap)})
    if truth:
        out["pct_of_truth"] = {k: 100 * v / truth for k, v in (
            ("full", out.get("full")), ("reserved_target", out.get("reserved_target")),
            ("first_aim_low", (out.get("first_aim") or [None])[0]), ("verified", out["verified"]),
            ("recommended", out["recommended"])) if isinstance(v, (int, float)) and not math.isinf(v)}
    return out


def curve(measures: list[dict], line: dict | None) -> list[dict]:
    """The measured readings by batch, the growth per sample since the previous batch, and the
    search's allocated line there."""
    rows, prev = [], None
    for m in sorted((m for m in measures if m.get("trial")), key=lambda m: m["batch"]):
        t = m["trial"]
        value = t.get("peak_before_step_bytes") or t.get("peak_allocated_bytes")
        row = {"batch": m["batch"], "fits": t["fits"], "verdict": t["verdict"],
               "allocated_gib": (t.get("peak_allocated_bytes") or 0) / GiB,
               "before_step_gib": (t.get("peak_before_step_bytes") or 0) / GiB,
               "reserved_gib": (t.get("peak_reserved_bytes") or 0) / GiB,
               "first_step_reserved_gib": (t.get("first_step_peak_reserved_bytes") or 0) / GiB,
               "caught_ooms": t.get("caught_ooms"), "cache_releases": t.get("cache_releases")}
        if prev is not None and value and t["fits"]:
            row["growth_mib_per_sample"] = (value - prev[1]) / (m["batch"] - prev[0]) / 2**20
        if line and value:
            predicted = line["intercept_bytes"] + line["slope_bytes_per_sample"] * m["batch"]
            row["line_error_pct"] = 100 * (predicted - value) / value
        if value and t["fits"]:
            prev = (m["batch"], value)
        rows.append(row)
    return rows


def one_model(pool: batch_fit_zoo.Pool, name: str, args: argparse.Namespace, log: Any) -> dict:
    base = {"model": name, "smoke": args.smoke, "steps": args.steps}
    rough = pool.run({**base, "kind": "rough", "rough_steps": 3})
    r = rough.get("rough_max")
    if not r:
        return {"model": name, "error": rough.get("error") or "the quick search found no batch", "rough": rough}
    log(f"  {name}: quick search {r}")

    def gpufit() -> dict:
        res = pool.run({**base, "kind": "finder", "finder": "gpufit"})
        if res.get("answer"):
            res["fresh_process"] = pool.run({**base, "kind": "sustain", "batch": res["answer"]})
        return res

    jobs = [gpufit, lambda: batch_fit_zoo.ground_truth(pool, base, r, probes=args.probes, precision=args.precision,
                                                       log=log)]
    jobs += [lambda b=b: pool.run({**base, "kind": "measure", "batch": b})
             for b in sorted({max(2, math.floor(f * r)) for f in FRACTIONS})]
    found, truth, *measures = batch_fit_zoo.in_threads(jobs)
    fit = found.get("fit") or {}
    out = {"model": name, "cap_bytes": rough.get("cap_bytes"), "rough": r, "truth": truth, "gpufit": found,
           "terms": terms(fit, truth.get("max")), "curve": curve(measures, fit.get("line_allocated"))}
    log(f"  {name}: fresh-process maximum {truth.get('max')}, %gpufit {found.get('answer')}")
    return out


def report_text(models: list[dict]) -> str:
    lines = []
    for m in models:
        lines.append(f"## {m['model']}")
        if "error" in m:
            lines += [f"error: {m['error']}", ""]
            continue
        truth = m["truth"].get("max")
        g, t = m["gpufit"], m["terms"]
        fresh = (g.get("fresh_process") or {}).get("ok")
        lines.append(f"cap {t['capacity_gib']:.2f} GiB; fresh-process maximum {truth} (failed at "
                     f"{m['truth'].get('failed_at')}); %gpufit recommended {g.get('answer')} "
                     f"({t.get('pct_of_truth', {}).get('recommended', float('nan')):.1f} %), trained in a fresh "
                     f"process: {fresh}")
        lines.append("")
        lines.append("| trial | batch | purpose | verdict | allocated GiB | before step GiB | reserved GiB | base GiB "
                     "| 1st-step reserved GiB | releases | caught OOMs |")
        lines.append("|" + "---|" * 11)
        for d in (g.get("fit") or {}).get("trials", []):
            lines.append(f"| {d['index']} | {d['batch']} | {d['purpose']} | {d['verdict']} | "
                         + " | ".join(f"{(d.get(k) or 0) / GiB:.3f}" for k in (
                             "peak_allocated_bytes", "peak_before_step_bytes", "peak_reserved_bytes",
                             "base_allocated_bytes", "first_step_peak_reserved_bytes"))
                         + f" | {d['cache_releases']} | {d['caught_ooms']} |")
        lines.append("")
        lines.append("terms: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in t.items() if k != "pct_of_truth"))
        lines.append("as % of the fresh-process maximum: " + ", ".join(
            f"{k} {v:.1f}" for k, v in t.get("pct_of_truth", {}).items()))
        lines.append("")
        lines.append("| measured batch | verdict | allocated GiB | before step GiB | reserved GiB "
                     "| 1st-step reserved GiB | growth MiB/sample | line error % |")
        lines.append("|" + "---|" * 8)
        for c in m["curve"]:
            nan = float("nan")
            lines.append(f"| {c['batch']} | {c['verdict']} | {c['allocated_gib']:.3f} | {c['before_step_gib']:.3f} | "
                         f"{c['reserved_gib']:.3f} | {c['first_step_reserved_gib']:.3f} | "
                         f"{c.get('growth_mib_per_sample', nan):.3f} | {c.get('line_error_pct', nan):.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", default="bn_convnet,conv_bn")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--probes", type=int, default=3)
    ap.add_argument("--precision", type=float, default=0.005)
    ap.add_argument("--budget-s", type=float, default=170)
    ap.add_argument("--smoke", action="store_true", help="the CPU twins on a simulated allocator")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:  # batch_fit_zoo's children run through its own script
        return batch_fit_zoo.main(["--worker", args.worker])
    import memory_zoo

    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in memory_zoo.ZOO]
    if unknown:
        ap.error(f"unknown model {', '.join(unknown)} (the zoo: {', '.join(memory_zoo.ZOO)})")
    start = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {text}", file=sys.stderr, flush=True)

    gpus: list[str | None] = [None] if args.smoke else list(batch_fit_zoo.visible_gpus())
    if not gpus:
        print("fit_margin_diagnosis: no NVIDIA GPU found; --smoke runs the pipeline on the CPU.", file=sys.stderr)
        return 2
    jobs = 2 if args.smoke else 8 * len(gpus)
    pool = batch_fit_zoo.Pool(gpus, jobs, time.monotonic() + args.budget_s, log,
                              room_gib=None if args.smoke else batch_fit_zoo.gpu_room_gib([g for g in gpus if g]))
    models = batch_fit_zoo.in_threads([lambda n=n: one_model(pool, n, args, log) for n in names])
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.monotonic() - start, "steps": args.steps,
              "environment": batch_fit_zoo.environment(args.smoke), "models": models}
    saved = batch_fit_zoo.write_report(args.out, "fit_margin_diagnosis", report, report_text(models))
    log(f"done in {report['seconds']:.0f} s: {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
