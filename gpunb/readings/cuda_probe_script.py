"""CUDA probe, run as a separate process by ``gpunb.readings.cuda_probe``.

Runs in its own interpreter so that the notebook kernel never gets a CUDA context (costs
~0.5 GB of VRAM, and breaks fork-based multi-GPU launchers later) and so that a crash or
a sticky CUDA error here cannot poison the user's kernel. Imports nothing from gpunb.

Protocol: one JSON object per line on stdout, flushed as soon as it is known:
  {"event": "step", "step": "...", "device": i}      a measurement starts (progress)
  {"event": "facts", ...}                             torch build and devices
  {"event": "result", "step": "...", "device": i, ...} a measurement's numbers
  {"event": "error", "step": "...", "device": i, "error": "..."}
  {"event": "done"}
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

_START = time.perf_counter()


def emit(**obj: Any) -> None:
    obj["elapsed_s"] = round(time.perf_counter() - _START, 3)
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def torch_facts(torch: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cuda_available": False,
        "cuda_error": None,
        "arch_list": [],
        "cudnn_version": None,
        "nccl_version": None,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "devices": [],
    }
    try:
        torch.cuda.init()
        facts["cuda_available"] = torch.cuda.is_available()
    except Exception as exc:  # "Found no NVIDIA driver", "driver too old", ...
        facts["cuda_error"] = f"{type(exc).__name__}: {exc}"
    if not facts["cuda_available"]:
        return facts
    facts["arch_list"] = torch.cuda.get_arch_list()
    try:
        facts["cudnn_version"] = torch.backends.cudnn.version()
    except Exception as exc:
        facts["cudnn_error"] = str(exc)
    try:
        nccl = torch.cuda.nccl.version()
        facts["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:
        facts["nccl_error"] = str(exc)
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "") or "")
        facts["devices"].append({
            "index": i,
            "name": p.name,
            "uuid": uuid if uuid.startswith(("GPU-", "MIG-")) or not uuid else "GPU-" + uuid,
            "capability": [p.major, p.minor],
            "total_memory_bytes": p.total_memory,
            "multiprocessors": p.multi_processor_count,
        })
    return facts


def timed(torch: Any, fn: Callable[[], Any], iters: int, warmup: int = 2) -> list[float]:
    """Per-iteration milliseconds from CUDA events, one sync at the end."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def smoke(torch: Any, dev: Any) -> dict[str, Any]:
    """One small success: a model and a batch on the GPU, forward, backward, optimizer step."""
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.empty(1, device=dev)  # creates the CUDA context on this device
    torch.cuda.synchronize(dev)
    context_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randn(256, 1024, device=dev)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    first = step()
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    steps = timed(torch, step, iters=20)
    loss = float(step())
    return {
        "context_ms": context_ms,
        "first_step_ms": first_ms,
        "step_ms_median": statistics.median(steps),
        "loss_finite": loss == loss and abs(loss) != float("inf"),
        "params_on_gpu": all(p.is_cuda for p in model.parameters()),
        "first_loss": float(first),
    }


def matmul(torch: Any, dev: Any, n: int = 8192) -> dict[str, Any]:
    """Dense matmul throughput in TFLOP/s: bf16, fp32 with TF32 tensor cores, strict fp32."""
    out: dict[str, Any] = {"n": n}
    flop = 2 * n**3
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype, tf32, iters in (("bf16", torch.bfloat16, False, 30), ("tf32", torch.float32, True, 15),
                                           ("fp32", torch.float32, False, 6)):
            if label == "bf16" and not torch.cuda.is_bf16_supported():
                out[label + "_tflops"] = None
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            ms = statistics.median(timed(torch, lambda: a @ b, iters=iters))  # noqa: B023 (called in this iteration)
            out[label + "_tflops"] = flop / (ms * 1e-3) / 1e12
            a = b = None  # free before the next dtype's pair
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    torch.cuda.empty_cache()
    return out


def copy_bandwidth(torch: Any, dev: Any, mib: int = 256) -> dict[str, Any]:
    """Host-to-device copy GB/s from pinned and from pageable host memory."""
    out: dict[str, Any] = {"bytes": mib * 2**20}
    dst = torch.empty(mib * 2**20, dtype=torch.uint8, device=dev)
    for label, pinned in (("pinned", True), ("pageable", False)):
        src = torch.empty(mib * 2**20, dtype=torch.uint8, pin_memory=pinned)
        src.fill_(1)
        copy = lambda: dst.copy_(src, non_blocking=pinned)  # noqa: B023, E731 (called in this iteration)
        ms = statistics.median(timed(torch, copy, iters=8))
        out[label + "_gbps"] = (mib * 2**20) / (ms * 1e-3) / 1e9
    return out


def main(argv: list[str]) -> int:
    devices = None
    for arg in argv:
        if arg.startswith("--devices="):
            devices = [int(x) for x in arg.split("=", 1)[1].split(",") if x]
    emit(event="step", step="import torch", device=None)
    try:
        import torch
    except Exception as exc:
        emit(event="error", step="import torch", device=None, error=f"{type(exc).__name__}: {exc}")
        emit(event="done")
        return 0
    emit(event="step", step="cuda init", device=None)
    facts = torch_facts(torch)
    emit(event="facts", **facts)
    if not facts["cuda_available"]:
        emit(event="done")
        return 0
    targets = devices if devices is not None else [d["index"] for d in facts["devices"]]
    for i in targets:
        dev = torch.device("cuda", i)
        for name, fn in (("smoke", smoke), ("matmul", matmul), ("copy", copy_bandwidth)):
            emit(event="step", step=name, device=i)
            try:
                emit(event="result", step=name, device=i, **fn(torch, dev))
            except Exception as exc:  # report and go on: one failure must not hide the rest
                emit(event="error", step=name, device=i, error=f"{type(exc).__name__}: {exc}"[:2000])
                torch.cuda.empty_cache()
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
