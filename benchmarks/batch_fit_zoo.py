"""%gpufit against Lightning's BatchSizeFinder and accelerate's find_executable_batch_size, on the zoo.

"Fits" means a batch trains a sustained run (``--steps``, 50) without an out-of-memory error.
For each model of ``memory_zoo.py``, under its per-process memory cap:

1. a quick same-process search (3-step runs; 10 for ``varlen``, whose longest batch comes
   every 10th step) brackets the answer;
2. ground truth: the largest batch that trains the sustained run in a FRESH process, by a
   parallel k-ary bisection (``--probes`` processes a round, each one probe, each its own
   sustained run) to ``--precision`` (0.5 %);
3. meanwhile each finder runs in a fresh process, as its users run it, and right after it, in
   the same process, a sustained run at its answer; then a sustained run at its answer in
   another fresh process.

Reported per finder: its answer as a percentage of the ground truth, its trials, its seconds,
and whether the answer crashed the sustained run in the same process or in a fresh one.
Processes run ``--jobs`` at a time, spread over ``--gpus``; each is capped at its model's
memory, so they do not disturb each other (they share the GPUs' compute, which slows them, not
their memory). Everything stops at ``--budget-s``: a truth not narrowed to the precision is
reported with the bracket it reached.

    python benchmarks/batch_fit_zoo.py --out DIR            # GPU: ~3-5 min on two H200s
    python benchmarks/batch_fit_zoo.py --out DIR --finders gpufit \
        --truth-from benchmarks/results/h200x2_batch_fit_zoo_run1.json   # only %gpufit again: ~2 min
    python benchmarks/batch_fit_zoo.py --smoke --out DIR    # the whole pipeline on the CPU (tiny twins)

``--truth-from`` reuses an earlier report's ground truth (same models, caps and ``--steps``; it
refuses otherwise): no quick search, no bisection. The finders not run again keep the earlier
report's results, and the table labels each column with the run it came from.

Writes ``DIR/batch_fit_zoo.json`` and ``DIR/batch_fit_zoo.md`` and prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FINDERS = ("gpufit", "lightning_power", "lightning_binsearch", "accelerate")
TITLES = {"gpufit": "%gpufit", "lightning_power": "Lightning power", "lightning_binsearch": "Lightning binsearch",
          "accelerate": "accelerate"}
RESULT = "RESULT "


# -- the child process --------------------------------------------------------------------------

def worker(task: dict) -> dict:
    """One fresh process's job: build the model under its cap, then run the task."""
    sys.path[:0] = [str(HERE), str(ROOT)]
    import batch_size_finders as finders
    import memory_zoo

    name, smoke, steps = task["model"], task["smoke"], task["steps"]
    t0 = time.perf_counter()
    cap = None if smoke else memory_zoo.cap_memory(name)
    model = memory_zoo.build(name, smoke=smoke)
    cap = cap or model.memory.budget
    kind = task["kind"]
    if kind == "sustain":
        out = finders.sustained(model, task["batch"], steps)
    elif kind == "rough":
        out = finders.rough_max(model, task["rough_steps"])
    elif kind == "measure":  # one %gpufit trial, alone in a fresh process: every reading it takes
        out = finders.measured(model, task["batch"], steps)
    elif kind == "finder":
        finder = task["finder"]
        if finder == "gpufit":
            out = finders.gpufit(model, steps=steps)
        elif finder.startswith("lightning_"):
            out = finders.lightning(model, mode=finder.removeprefix("lightning_"))
        elif finder == "accelerate":
            out = finders.accelerate(model, start=task["start"])
        else:
            raise ValueError(f"unknown finder {finder!r}")
        if out.get("answer"):
            out["same_process"] = finders.sustained(model, out["answer"], steps)
    else:
        raise ValueError(f"unknown task {kind!r}")
    out["cap_bytes"] = cap
    out["process_seconds"] = time.perf_counter() - t0
    return out


# -- running children ---------------------------------------------------------------------------

class Pool:
    """At most ``jobs`` child processes at once, each on the least busy GPU, none past the deadline.
    With ``room_gib`` (GiB per GPU), a child also waits until its model's cap (and its CUDA
    context) fits beside the caps of the children already on that GPU: caps that add up to more
    than the GPU holds would turn the others' memory into out-of-memory errors the caps never made."""

    CONTEXT_GIB = 1.0  # a CUDA context and torch's kernels, outside the allocator's cap

    def __init__(self, gpus: list[str | None], jobs: int, deadline: float, log: Any,
                 room_gib: dict[str | None, float] | None = None) -> None:
        self.gpus = gpus
        self.busy = {g: 0 for g in gpus}
        self.used = {g: 0.0 for g in gpus}
        self.room = room_gib or {}
        self.slots = threading.Semaphore(jobs)
        self.lock = threading.Condition()
        self.deadline = deadline
        self.log = log
        self.launched = 0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _need(self, task: dict) -> float:
        if task.get("smoke"):
            return 0.0
        import memory_zoo

        return memory_zoo.ZOO[task["model"]].cap_gib + self.CONTEXT_GIB

    def _gpus_with_room(self, need: float) -> list[str | None]:
        return [g for g in self.gpus if g not in self.room or self.used[g] + need <= self.room[g]
                or self.busy[g] == 0]  # alone on a GPU a child always runs (its cap is its own)

    def run(self, task: dict) -> dict:
        need = self._need(task)
        with self.slots:
            with self.lock:
                while not (room := self._gpus_with_room(need)) and self.left() >= 3:
                    self.lock.wait(timeout=max(0.1, min(5.0, self.left())))
                if self.left() < 3 or not room:
                    return {"error": "budget spent before this job started", "skipped": True}
                gpu = min(room, key=lambda g: self.busy[g])
                self.busy[gpu] += 1
                self.used[gpu] += need
                self.launched += 1
            try:
                return self._run(task, gpu)
            finally:
                with self.lock:
                    self.busy[gpu] -= 1
                    self.used[gpu] -= need
                    self.lock.notify_all()

    def _run(self, task: dict, gpu: str | None) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)],
                                  capture_output=True, text=True, env=env, timeout=max(3.0, self.left()))
        except subprocess.TimeoutExpired:
            return {"error": "stopped at the budget", "gpu": gpu, "wall_seconds": time.monotonic() - t0}
        wall = time.monotonic() - t0
        lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT)]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
            self.log(f"  ! {task['model']} {task['kind']} {task.get('finder', task.get('batch', ''))}: "
                     f"exit {proc.returncode}: {tail[-1] if tail else ''}")
            return {"error": f"child exited {proc.returncode}", "stderr_tail": tail, "gpu": gpu, "wall_seconds": wall}
        out = json.loads(lines[-1][len(RESULT):])
        out["gpu"], out["wall_seconds"] = gpu, wall
        return out


def in_threads(fns: list[Any]) -> list[Any]:
    """Run the callables at once, each in a thread; their results in order."""
    results: list[Any] = [None] * len(fns)

    def call(i: int, fn: Any) -> None:
        results[i] = fn()

    threads = [threading.Thread(target=call, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# -- ground truth -------------------------------------------------------------------------------

def next_probes(lo: int, hi: int | None, k: int) -> list[int]:
    """``k`` batches to try next: evenly inside (lo, hi), or growing from lo when nothing failed."""
    if hi is None:
        pts = [math.ceil(lo * f) for f in (1.15, 1.3, 1.5, 1.75, 2.0)[:k]]
    elif lo <= 0:
        pts = [max(1, math.floor(hi * f)) for f in (0.8, 0.6, 0.4, 0.25, 0.1)[:k]]
    else:
        pts = [lo + round((hi - lo) * i / (k + 1)) for i in range(1, k + 1)]
    return sorted({p for p in pts if p > lo and (hi is None or p < hi)})


def ground_truth(pool: Pool, base: dict, rough: int, *, probes: int, precision: float, log: Any) -> dict:
    """Largest batch whose sustained run trained in a fresh process, by parallel bisection."""
    lo, hi = 0, None
    tried: list[dict] = []
    pts = sorted({max(1, math.floor(rough * f)) for f in (0.7, 0.85, 1.0)[:max(1, probes)]})
    rounds = 0
    while pts:
        round_start = time.monotonic()
        results = in_threads([lambda b=b: pool.run({**base, "kind": "sustain", "batch": b}) for b in pts])
        rounds += 1
        for b, r in zip(pts, results):
            tried.append({"batch": b, "ok": r.get("ok"), "steps_done": r.get("steps_done"), "error": r.get("error"),
                          "wall_seconds": r.get("wall_seconds")})
        if any("ok" not in r for r in results):
            break  # a child did not report (crash, budget): keep what is known
        fails = [t["batch"] for t in tried if t["ok"] is False]
        hi = min(fails) if fails else None
        passes = [t["batch"] for t in tried if t["ok"] and (hi is None or t["batch"] < hi)]
        lo = max(passes) if passes else 0
        if hi is not None and hi - lo <= max(1, precision * max(lo, 1)):
            break
        took = time.monotonic() - round_start
        if pool.left() < 1.3 * took:
            log(f"  {base['model']}: budget too short for another bisection round")
            break
        pts = next_probes(lo, hi, probes)
    above = [t["batch"] for t in tried if t["ok"] and hi is not None and t["batch"] > hi]
    return {"max": lo or None, "failed_at": hi, "rounds": rounds, "precision": (hi - lo) / lo if lo and hi else None,
            "probes": tried, "passed_above_a_failure": above}


# -- one model ------------------------------------------------------------------------------------

def run_model(pool: Pool, name: str, args: argparse.Namespace, log: Any) -> dict:
    base = {"model": name, "smoke": args.smoke, "steps": args.steps}
    rough_steps = 10 if name == "varlen" else 3
    t0 = time.monotonic()
    earlier = args.truth_models.get(name) if args.truth_models else None
    if earlier is not None:  # the ground truth of an earlier run on the same machine, models and caps
        rough = earlier["rough"]
        out: dict[str, Any] = {"model": name, "rough": rough, "cap_bytes": earlier["cap_bytes"]}
    else:
        rough = pool.run({**base, "kind": "rough", "rough_steps": rough_steps})
        out = {"model": name, "rough": rough, "cap_bytes": rough.get("cap_bytes")}
    if not rough.get("rough_max"):
        out["error"] = rough.get("error") or "the quick search found no batch that runs"
        return out
    r = rough["rough_max"]
    if earlier is None:
        log(f"  {name}: quick same-process search: {r} ({rough_steps}-step runs)")

    def finder_flow(finder: str) -> dict:
        from batch_size_finders import accelerate_start

        res = pool.run({**base, "kind": "finder", "finder": finder, "start": accelerate_start(r)})
        answer = res.get("answer")
        if answer:
            res["fresh_process"] = pool.run({**base, "kind": "sustain", "batch": answer})
        log(f"  {name}: {finder}: {answer} in {res.get('trial_count')} trials")
        return res

    jobs = [lambda f=f: finder_flow(f) for f in args.finders]
    if earlier is None:
        jobs.append(lambda: ground_truth(pool, base, r, probes=args.probes, precision=args.precision, log=log))
        *found, truth = in_threads(jobs)
        log(f"  {name}: sustained maximum in a fresh process: {truth['max']} (failed at {truth['failed_at']})")
    else:
        found, truth = in_threads(jobs), {**earlier["truth"], "from": args.truth_label}
    out["truth"] = truth
    out["finders"] = dict(zip(args.finders, found))
    if earlier is not None:  # the finders not run again, as the earlier run found them
        out["earlier_finders"] = {f: v for f, v in earlier.get("finders", {}).items() if f not in args.finders}
    out["seconds"] = time.monotonic() - t0
    return out


def load_truth(path: str, args: argparse.Namespace) -> tuple[dict, str, str]:
    """The models of an earlier report whose ground truth can stand for this run's: same models,
    caps, steps and kind of run (GPU or --smoke). Returns (models by name, label, problem)."""
    import memory_zoo

    try:
        report = json.loads(Path(path).read_text())
        models = {m["model"]: m for m in report["models"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {}, "", f"--truth-from {path}: not a batch_fit_zoo.json report ({exc})"
    problems = []
    if bool(report.get("environment", {}).get("smoke")) != args.smoke:
        problems.append("it was " + ("a --smoke run" if report.get("environment", {}).get("smoke") else "a GPU run"))
    if report.get("steps") != args.steps:
        problems.append(f"its sustained runs had {report.get('steps')} steps, not --steps {args.steps}")
    for name in args.models:
        m = models.get(name)
        if m is None or not (m.get("truth") or {}).get("max"):
            problems.append(f"it has no ground truth for {name}")
        elif m.get("cap_bytes") != int(memory_zoo.ZOO[name].cap_gib * memory_zoo.GiB):
            problems.append(f"{name} was capped at {m.get('cap_bytes')} bytes there, "
                            f"{int(memory_zoo.ZOO[name].cap_gib * memory_zoo.GiB)} in this zoo")
    if problems:
        return {}, "", (f"--truth-from {path} cannot stand for this run: " + "; ".join(problems)
                        + ". Run without --truth-from to measure the ground truth again.")
    return models, f"run of {report.get('date', '?')}", ""


# -- report -------------------------------------------------------------------------------------

def summarize(finder: dict, truth: int | None) -> dict:
    answer = finder.get("answer")
    same = (finder.get("same_process") or {}).get("ok")
    fresh = (finder.get("fresh_process") or {}).get("ok")
    return {"answer": answer, "pct_of_max": 100 * answer / truth if answer and truth else None,
            "trials": finder.get("trial_count"), "seconds": finder.get("seconds"),
            "trains_same_process": same, "trains_fresh_process": fresh,
            "unavailable": finder.get("unavailable") or finder.get("error")}


def cell(s: dict) -> str:
    if s["answer"] is None:
        return "n/a" + (f" ({s['unavailable']})" if s["unavailable"] else "")
    pct = f" ({s['pct_of_max']:.0f} %)" if s["pct_of_max"] is not None else ""
    crashed = [w for w, ok in (("same", s["trains_same_process"]), ("fresh", s["trains_fresh_process"]))
               if ok is False]
    verdict = "✓" if not crashed and s["trains_fresh_process"] else ("✗ OOM in " + " and ".join(
        f"{w} process" for w in crashed) if crashed else "? not run")
    secs = f"{s['seconds']:.0f} s" if s["seconds"] is not None else "? s"
    return f"{s['answer']}{pct}, {s['trials']} trials, {secs}, {verdict}"


def gib(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def columns(report: dict) -> list[tuple[str, str, str]]:
    """(finder, where its results are: "summary" or "earlier_summary", heading) of each column."""
    label = report.get("truth_from", {}).get("label")
    now = f" ({'this run, ' + report['date']})" if label else ""
    cols = [(f, "summary", TITLES[f] + now) for f in report["finders"]]
    earlier = [f for f in FINDERS if f not in report["finders"]
               and any(f in m.get("earlier_summary", {}) for m in report["models"])]
    cols += [(f, "earlier_summary", f"{TITLES[f]} ({label})") for f in earlier]
    return cols


def table(report: dict) -> str:
    cols = columns(report)
    label = report.get("truth_from", {}).get("label")
    head = ["model", "cap", "sustained max (fresh process" + (f", {label})" if label else ")")] + [c[2] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in report["models"]:
        t = m.get("truth") or {}
        mx = t.get("max")
        truth = (f"{mx}" + (f" (±{100 * t['precision']:.1f} %)" if t.get("precision") and t["precision"] > 0.005
                            else "") if mx else f"? ({m.get('error', 'not found')})")
        cells = [cell(m[where][f]) if f in m.get(where, {}) else "n/a" for f, where, _ in cols]
        lines.append("| " + " | ".join([m["model"], gib(m.get("cap_bytes")), truth, *cells]) + " |")
    lines.append("")
    lines.append("Each cell: answer (% of the sustained maximum), trials, seconds, and ✓ when the answer trained "
                 f"{report['steps']} steps in the finder's process and in a fresh one.")
    if label:
        lines.append(f"The sustained maxima and the columns marked ({label}) come from that run "
                     f"({report['truth_from']['path']}); the others from this one.")
    for f, where, heading in cols:
        rows = [m[where][f] for m in report["models"] if f in m.get(where, {})]
        pcts = [r["pct_of_max"] for r in rows if r["pct_of_max"] is not None]
        crashes = sum(1 for r in rows if r["trains_same_process"] is False or r["trains_fresh_process"] is False)
        secs = sum(r["seconds"] or 0 for r in rows)
        if pcts:
            lines.append(f"- {heading}: median {statistics.median(pcts):.0f} % of the maximum (min {min(pcts):.0f} %, "
                         f"max {max(pcts):.0f} %), {crashes} of {len(rows)} answers crashed a sustained run, "
                         f"{secs:.0f} s in all")
    return "\n".join(lines)


def write_report(out_dir: str, name: str, report: dict, text: str) -> Path:
    """``report`` as DIR/name.json and ``text`` as DIR/name.md, the text printed; the JSON's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    (out / f"{name}.md").write_text(text + "\n")
    print(text)
    return out / f"{name}.json"


def environment(smoke: bool) -> dict:
    from importlib import metadata

    env: dict[str, Any] = {"python": sys.version.split()[0], "smoke": smoke}
    for pkg in ("torch", "lightning", "accelerate"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    if not smoke and shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True)
        env["gpus"] = q.stdout.strip().splitlines()
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return env


def gpu_room_gib(gpus: list[str]) -> dict[str | None, float]:
    """Each visible GPU's free memory in GiB now, less 5 % (nvidia-smi), for :class:`Pool`'s
    ``room_gib`` (free, not total: another job on the GPU keeps what it holds)."""
    if not shutil.which("nvidia-smi"):
        return {}
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    total = {}
    for line in q.stdout.splitlines():
        index, _, mib = line.partition(",")
        if mib.strip().isdigit():
            total[index.strip()] = 0.95 * int(mib) / 1024
    return {g: total[g] for g in gpus if g in total}


def visible_gpus() -> list[str]:
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        n = sum(1 for x in q.stdout.splitlines() if x.startswith("GPU "))
        if n:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return [g.strip() for g in visible.split(",") if g.strip()] if visible else [str(i) for i in range(n)]
    return []


def _report_models(path: str | None) -> list[str]:
    """The zoo models an earlier report has (``--truth-from`` without ``--models``: those)."""
    import memory_zoo

    try:
        return [m["model"] for m in json.loads(Path(path).read_text())["models"] if m["model"] in memory_zoo.ZOO]
    except (TypeError, OSError, ValueError, KeyError):
        return []  # no report: load_truth says why


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results", help="directory for batch_fit_zoo.json and .md")
    ap.add_argument("--budget-s", type=float, default=330, help="stop everything after this many seconds (330)")
    ap.add_argument("--jobs", type=int, default=None, help="child processes at once (8 per GPU; 2 with --smoke)")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU ids for CUDA_VISIBLE_DEVICES (all)")
    ap.add_argument("--models", default=None, help="comma-separated zoo models (all)")
    ap.add_argument("--finders", default=",".join(FINDERS), help="comma-separated finders (all)")
    ap.add_argument("--steps", type=int, default=50, help="steps of a sustained run (50)")
    ap.add_argument("--probes", type=int, default=3, help="fresh processes per bisection round (3)")
    ap.add_argument("--precision", type=float, default=0.005, help="stop bisecting at this relative gap (0.005)")
    ap.add_argument("--truth-from", metavar="JSON", help="reuse the ground truth (and the other finders' results) of\n"
                    "an earlier batch_fit_zoo.json with the same models, caps and --steps: no bisection")
    ap.add_argument("--smoke", action="store_true", help="CPU twins with a simulated allocator: checks the pipeline")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import memory_zoo

    args.models = args.models.split(",") if args.models else _report_models(args.truth_from) or list(memory_zoo.ZOO)
    args.finders = [f for f in args.finders.split(",") if f]
    bad = [m for m in args.models if m not in memory_zoo.ZOO] + [f for f in args.finders if f not in FINDERS]
    if bad:
        ap.error(f"unknown model or finder: {', '.join(bad)} (models: {', '.join(memory_zoo.ZOO)}; "
                 f"finders: {', '.join(FINDERS)})")
    if args.steps < 1 or args.probes < 1 or args.budget_s <= 0:
        ap.error("--steps and --probes must be at least 1, --budget-s positive")
    args.truth_models, args.truth_label = {}, ""
    if args.truth_from:
        args.truth_models, args.truth_label, problem = load_truth(args.truth_from, args)
        if problem:
            ap.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(HERE), str(ROOT)]
    args = parse(argv)
    if args.worker:
        print(RESULT + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    start = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {text}", file=sys.stderr, flush=True)

    gpus: list[str | None]
    if args.smoke:
        gpus = [None]
    else:
        gpus = args.gpus.split(",") if args.gpus else visible_gpus()
        if not gpus:
            print("batch_fit_zoo: no NVIDIA GPU found (nvidia-smi -L lists none). On a machine without one, "
                  "--smoke runs the whole pipeline on the CPU.", file=sys.stderr)
            return 2
    jobs = args.jobs or (2 if args.smoke else 8 * len(gpus))
    pool = Pool(gpus, jobs, time.monotonic() + args.budget_s, log,
                room_gib=None if args.smoke else gpu_room_gib([g for g in gpus if g is not None]))
    log(f"{len(args.models)} models, finders {', '.join(args.finders)}, {jobs} processes at once on "
        f"{'the CPU (smoke)' if args.smoke else 'GPUs ' + ','.join(gpus)}, budget {args.budget_s:.0f} s"
        + (f"; ground truth of the {args.truth_label} ({args.truth_from})" if args.truth_from else ""))
    models = in_threads([lambda m=m: run_model(pool, m, args, log) for m in args.models])
    for m in models:
        truth = (m.get("truth") or {}).get("max")
        if "finders" in m:
            m["summary"] = {f: summarize(m["finders"][f], truth) for f in args.finders}
        if m.get("earlier_finders"):
            m["earlier_summary"] = {f: summarize(v, truth) for f, v in m["earlier_finders"].items()}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.monotonic() - start, "steps": args.steps,
              "budget_s": args.budget_s, "jobs": jobs, "processes": pool.launched, "finders": args.finders,
              "environment": environment(args.smoke), "models": models}
    if args.truth_from:
        report["truth_from"] = {"path": args.truth_from, "label": args.truth_label}
    saved = write_report(args.out, "batch_fit_zoo", report, table(report))
    log(f"done: {pool.launched} processes in {report['seconds']:.0f} s; {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
