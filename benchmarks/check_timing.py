"""How long `%load_ext gpunb` and `%gpucheck` (quick, full, --deep) take, side by side with
`python -c "import torch; torch.ones(1, device='cuda')"` in one run.

Target (issue 10): the full one-GPU check within 2x of that one-liner. Every figure is the
wall time of a fresh interpreter from start to exit (what a user waits for in a terminal, and
about what a new kernel pays), variants interleaved so that drift hits all alike:

- ``import_torch``: ``python -c "import torch"``
- ``torch_ones_cuda``: ``python -c "import torch; torch.ones(1, device='cuda')"`` (the yardstick)
- ``load_ext``: IPython, then ``%load_ext gpunb`` (asserts torch stays unimported)
- ``check_quick`` / ``check_full``: ``python -m gpunb check [--quick] --json`` on one GPU
  (CUDA_VISIBLE_DEVICES=0)
- ``check_deep``: ``python -m gpunb check --deep --json`` on every GPU (only with >= 2 GPUs)

Then one full check's CUDA probe, run in this process, prints where its time goes (the probe's
own timeline and the parts of the smoke test's first step). Usage, on a GPU machine:

    python benchmarks/check_timing.py --out DIR [--repeat 3]

Writes DIR/check_timing.json. NVLink multicast stays off for --deep (gpunb's ranks set it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD_EXT = textwrap.dedent("""
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    import sys; assert "torch" not in sys.modules
""")


def variants(gpus: int) -> dict[str, tuple[list[str], dict]]:
    one = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    py = sys.executable
    out = {
        "import_torch": ([py, "-c", "import torch"], {}),
        "torch_ones_cuda": ([py, "-c", "import torch; torch.ones(1, device='cuda')"], one),
        "load_ext": ([py, "-c", LOAD_EXT], {}),
        "check_quick": ([py, "-m", "gpunb", "check", "--quick", "--json"], one),
        "check_full": ([py, "-m", "gpunb", "check", "--json"], one),
    }
    if gpus >= 2:
        out["check_deep"] = ([py, "-m", "gpunb", "check", "--deep", "--json"], {})
    return out


def wall(cmd: list[str], extra_env: dict) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra_env}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    dt = time.perf_counter() - t
    if proc.returncode not in (0, 1):  # 1: a check failed, still a full run
        raise RuntimeError(f"{cmd}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return dt, proc.stdout


def probe_breakdown() -> dict:
    """One CUDA probe on GPU 0, in this process's child, with its timeline."""
    sys.path.insert(0, str(ROOT))
    from gpunb.readings.cuda_probe import run_probe

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    result = run_probe(environ=env)
    return {"duration_s": result.duration_s, "timeline": result.timeline,
            "smoke": result.result("smoke", 0), "error": result.error}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from gpunb.readings.nvml import NvmlSession

    gpus = NvmlSession().device_count()
    runs: dict[str, list[float]] = {}
    reports: dict[str, dict] = {}
    for _ in range(args.repeat):  # interleaved
        for name, (cmd, env) in variants(gpus).items():
            dt, out = wall(cmd, env)
            runs.setdefault(name, []).append(dt)
            if name.startswith("check_") and out.strip().startswith("{"):
                reports[name] = json.loads(out)
    table = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "n": len(v), "runs_s": v}
             for name, v in runs.items()}
    base = table["torch_ones_cuda"]["median_s"]
    print(f"{'what':16} {'median s':>9} {'min s':>7} {'max s':>7} {'/ torch.ones cuda':>18}")
    for name, row in table.items():
        print(f"{name:16} {row['median_s']:9.2f} {row['min_s']:7.2f} {row['max_s']:7.2f} "
              f"{row['median_s'] / base:18.2f}")
    ratio = table["check_full"]["median_s"] / base
    print(f"\nfull one-GPU check / torch.ones(cuda): {ratio:.2f}x (target: at most 2x)")
    breakdown = probe_breakdown()
    print("\nCUDA probe timeline (seconds since the probe started):")
    for event, step, device, elapsed in breakdown["timeline"]:
        if event in ("step", "done"):
            print(f"  {elapsed:7.3f}  {event} {step or ''}{'' if device is None else f' cuda:{device}'}")
    smoke = breakdown["smoke"] or {}
    keys = ("context_ms", "optimizer_import_ms", "optimizer_import_wait_ms", "model_build_ms", "first_forward_ms",
            "first_backward_ms", "first_optimizer_step_ms", "first_step_ms", "step_ms_median", "module_loading")
    print("smoke test parts:", {k: smoke.get(k) for k in keys})
    deep = reports.get("check_deep", {})
    nccl = next((c for c in deep.get("checks", []) if c["id"] == "nccl_allreduce"), None)
    if nccl:
        print("\n--deep all-reduce:", nccl["status"], nccl["summary"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_timing.json").write_text(json.dumps(
        {"gpus": gpus, "table": table, "full_over_torch_ones": ratio, "probe": breakdown,
         "nccl_allreduce": nccl, "reports": reports}, indent=2, default=str))


if __name__ == "__main__":
    main()
