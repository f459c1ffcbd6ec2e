"""Record what a training step really takes on the GPU, for ``%gpuplan``'s calibration and accuracy.

For each model of ``plan_zoo.py`` at each of its three batch sizes, in a FRESH process (so the
caching allocator, cuDNN's choices and the context start clean), on one GPU:

- ``weights_bytes``: ``torch.cuda.memory_allocated`` after the model and optimizer are built;
- ``step1_peak_allocated`` / ``step1_peak_reserved``: the peaks of the first step (it creates the
  optimizer state);
- ``steady_peak_allocated`` / ``steady_peak_reserved``: the peaks of the later steps, after
  ``torch.cuda.reset_peak_memory_stats`` (``plan_zoo.STEPS``: 3 steps, more where a shape cycles);
- ``step_peaks_allocated``: each step's own peak;
- ``end_allocated`` / ``end_reserved``: after the last step;
- ``nvml_used_bytes``: what NVML says the process holds at the end, and ``context_bytes``: that
  minus ``torch.cuda.memory_reserved`` (the CUDA context, cuBLAS/cuDNN handles, modules loaded).

It also measures, in fresh processes, what cuBLAS's workspace adds to ``memory_allocated`` at the
first fp32, TF32 and bf16 matmul (``workspace`` records), and a process that only creates its
context (``context`` record).

    python benchmarks/plan_calibration_record.py --out DIR [--jobs 3] [--models a,b]

Writes ``DIR/plan_calibration.json``. Processes run ``--jobs`` at a time on the one GPU; each
measures only its own allocator, so they do not disturb each other's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULT = "RESULT "


def _nvml_used(pid: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0)
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == pid:
                    return int(p.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  (a reading that is not there is recorded as None)
        return None
    return None


def measure_step(name: str, batch: int) -> dict[str, Any]:
    """One (model, batch) in this process: build, then the first step and the steady steps."""
    sys.path[:0] = [str(HERE), str(ROOT)]
    import plan_zoo
    import torch

    cuda = torch.cuda
    model = plan_zoo.build(name, "cuda")
    cuda.synchronize()
    out: dict[str, Any] = {"kind": "step", "model": name, "batch": batch,
                           "weights_bytes": cuda.memory_allocated(),
                           "params": sum(p.numel() for p in model.module.parameters())}
    peaks: list[int] = []
    reserved: list[int] = []
    starts: list[int] = []
    steps = plan_zoo.STEPS.get(name, 3)
    try:
        for _ in range(steps):
            cuda.reset_peak_memory_stats()  # each step's own peak
            starts.append(cuda.memory_allocated())
            model.step(batch)
            cuda.synchronize()
            peaks.append(cuda.max_memory_allocated())
            reserved.append(cuda.max_memory_reserved())
    except torch.OutOfMemoryError as e:
        out.update(oom=str(e).splitlines()[0][:300], steps_done=len(peaks))
        return out
    out.update(step_start_allocated=starts, step_peaks_allocated=peaks, step_peaks_reserved=reserved,
               step1_peak_allocated=peaks[0], step1_peak_reserved=reserved[0],
               steady_peak_allocated=max(peaks[1:]), steady_peak_reserved=max(reserved[1:]))
    out["end_allocated"] = cuda.memory_allocated()
    out["end_reserved"] = cuda.memory_reserved()
    stats = cuda.memory_stats()
    out["segments"] = {k: stats.get(k) for k in ("segment.all.current", "segment.large_pool.current",
                                                 "segment.small_pool.current", "num_alloc_retries")}
    used = _nvml_used(os.getpid())
    out["nvml_used_bytes"] = used
    out["context_bytes"] = used - cuda.memory_reserved() if used is not None else None
    out["steps"] = steps
    return out


def measure_workspace() -> dict[str, Any]:
    """What the first matmul of each precision adds to memory_allocated beyond its output (cuBLAS's workspace)."""
    import torch

    cuda = torch.cuda
    out: dict[str, Any] = {"kind": "workspace"}
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                               ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(1024, 1024, device="cuda", dtype=dtype)
        b = torch.randn(1024, 1024, device="cuda", dtype=dtype)
        cuda.synchronize()
        before = cuda.memory_allocated()
        c = a @ b
        cuda.synchronize()
        out[label] = cuda.memory_allocated() - before - c.numel() * c.element_size()
        del a, b, c
    out["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return out


def measure_context() -> dict[str, Any]:
    """A process that only starts CUDA: the context's size as NVML sees it."""
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    used = _nvml_used(os.getpid())
    return {"kind": "context", "nvml_used_bytes": used, "reserved": torch.cuda.memory_reserved(),
            "context_bytes": used - torch.cuda.memory_reserved() if used is not None else None}


def child(task: dict[str, Any]) -> dict[str, Any]:
    if task["kind"] == "step":
        return measure_step(task["model"], task["batch"])
    if task["kind"] == "workspace":
        return measure_workspace()
    return measure_context()


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            out = json.loads(line[len(RESULT):])
            break
    else:
        out = dict(task, error=(proc.stderr or proc.stdout)[-2000:], returncode=proc.returncode)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
                           "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, total_bytes=p.total_memory)
        env["mem_get_info"] = list(torch.cuda.mem_get_info(0))  # starts CUDA in the parent: after the children
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--models", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    sys.path[:0] = [str(HERE)]
    import plan_zoo

    models = [m for m in args.models.split(",") if m] or list(plan_zoo.MODELS)
    tasks: list[dict[str, Any]] = [{"kind": "context"}, {"kind": "workspace"}]
    tasks += [{"kind": "step", "model": m, "batch": b} for m in models for b in plan_zoo.BATCHES[m]]
    t0 = time.perf_counter()
    records = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for rec in pool.map(run_task, tasks):
            records.append(rec)
            brief = {k: rec.get(k) for k in ("kind", "model", "batch", "steady_peak_allocated", "oom", "error",
                                             "wall_s")}
            print(json.dumps(brief)[:400], flush=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "seconds": round(time.perf_counter() - t0, 1),
              "command": "python benchmarks/plan_calibration_record.py " + " ".join(argv or sys.argv[1:]),
              "environment": environment(), "records": records}
    path = Path(args.out) / "plan_calibration.json"
    path.write_text(json.dumps(report, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
