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
import os
import sys
import threading
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


class OptimizerImport:
    """``import torch._dynamo`` in a background thread, timed.

    torch.optim's first optimizer imports it (``Optimizer.add_param_group`` is wrapped by
    ``torch._disable_dynamo``, which imports ``torch._dynamo`` on its first call): 2.0-2.5 s of
    Python on this project's CPU box, more than a third of what used to be reported as the
    smoke test's "first step". It is no GPU cost, so it runs here while the GPU measurements
    run, which wait on the GPU (releasing the GIL) most of the time; :func:`gpu_timed` keeps
    the GIL it takes from distorting them."""

    def __init__(self) -> None:
        self.ms: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="probe-optimizer-import", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            import torch._dynamo  # noqa: F401
        except Exception as exc:  # noqa: BLE001 (an old or trimmed torch: the smoke test pays it, or not)
            self.error = f"{type(exc).__name__}: {exc}"
        self.ms = (time.perf_counter() - t0) * 1e3

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> float:
        """Wait for the import; the milliseconds waited."""
        t0 = time.perf_counter()
        self._thread.join()
        return (time.perf_counter() - t0) * 1e3


class GpuClock:
    """GPU-timed work that stays right while this process's host thread is slowed down.

    A CUDA-event pair around work measures the GPU from the first event to the last; if the
    host is late to queue the next launch (the import thread holding the GIL), the GPU idles
    in between and the idle time counts. So the work is queued behind a spin kernel
    (``torch.cuda._sleep``) that keeps the GPU busy meanwhile; an event after the spin says
    whether it ended before everything was queued, and then the measurement is repeated with
    a longer spin."""

    def __init__(self, torch: Any, dev: Any) -> None:
        self.torch = torch
        self.sleep: Any = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_ms: float | None = None
        if self.sleep is not None:  # how many spin cycles make a millisecond on this GPU
            with torch.cuda.device(dev):
                for lead in (50_000_000, 400_000_000):  # a lead spin (~20 ms at 2.5 GHz) covers the queueing
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    guard = torch.cuda.Event()
                    self.sleep(lead)
                    guard.record()
                    a.record()
                    self.sleep(1_000_000)
                    b.record()
                    starved = guard.query()
                    b.synchronize()
                    if not starved:
                        break
                self.cycles_per_ms = 1_000_000 / max(a.elapsed_time(b), 1e-3)

    def time(self, fn: Callable[[], Any], iters: int, warmup: int = 1, busy: bool = False) -> float:
        """Milliseconds per call of ``fn``, ``iters`` calls back to back. ``busy``: another
        thread of this process competes for the GIL (a longer spin from the start)."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        cycles = self.cycles_per_ms
        spin_ms = (10.0 + (6.0 * iters if busy else 0.0)) if cycles else 0.0
        ms = 0.0
        for _ in range(4):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            guard = torch.cuda.Event()
            if spin_ms and cycles:
                self.sleep(int(spin_ms * cycles))
            guard.record()
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            starved = bool(spin_ms) and guard.query()  # the spin ended before all was queued
            end.synchronize()
            ms = float(start.elapsed_time(end)) / iters
            if not starved:
                break
            spin_ms *= 4
        return ms


def smoke(torch: Any, dev: Any, clock: GpuClock, optimizer_import: OptimizerImport | None) -> dict[str, Any]:
    """One small success: a model and a batch on the GPU, forward, backward, optimizer step.
    The first step is timed part by part, each part synchronized: what it costs is cuBLAS
    setting up and CUDA loading each kernel on its first use (CUDA_MODULE_LOADING=LAZY, torch's
    default), not the training itself."""
    out: dict[str, Any] = {"module_loading": os.environ.get("CUDA_MODULE_LOADING", "LAZY (torch's default)")}
    if optimizer_import is not None:
        out["optimizer_import_wait_ms"] = optimizer_import.join()
        out["optimizer_import_ms"] = optimizer_import.ms
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randn(256, 1024, device=dev)
    torch.cuda.synchronize(dev)
    out["model_build_ms"] = (time.perf_counter() - t0) * 1e3

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        value = fn()
        torch.cuda.synchronize(dev)
        out[name] = (time.perf_counter() - t) * 1e3
        return value

    first = phase("first_forward_ms", lambda: torch.nn.functional.mse_loss(model(x), y))
    phase("first_backward_ms", first.backward)
    phase("first_optimizer_step_ms", opt.step)
    out["first_step_ms"] = out["first_forward_ms"] + out["first_backward_ms"] + out["first_optimizer_step_ms"]

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    out["step_ms_median"] = clock.time(step, iters=10, warmup=2)  # the mean of 10 back-to-back steps
    loss = float(step().detach())
    out.update(loss_finite=loss == loss and abs(loss) != float("inf"),
               params_on_gpu=all(p.is_cuda for p in model.parameters()), first_loss=float(first.detach()))
    return out


# bf16 matmuls back to back: first SETTLE_MS untimed for the clock's fall, then SUSTAINED_MS
# timed (see matmul())
SETTLE_MS = 150.0
SUSTAINED_MS = 100.0


def sustained_matmul(torch: Any, a: Any, b: Any, call_ms: float, flop: int) -> dict[str, Any]:
    """``a @ b`` back to back for SETTLE_MS, then timed for SUSTAINED_MS with no gap between.

    The calls are replayed from a CUDA graph of ~50 ms of them, so the whole run is a handful
    of host calls queued while the GPU works through the first: a host thread slowed by the
    import thread (GIL) cannot leave the GPU idle, and nothing waits between settling and
    timing. A marker event after the settling part tells whether the GPU got there before
    the timed part was queued (then it is repeated once, and said)."""
    c = torch.empty_like(a)
    per = max(1, round(50.0 / max(call_ms, 1e-3)))  # calls per replay
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # graph capture wants the work warmed up off the default stream
        torch.matmul(a, b, out=c)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per):
            torch.matmul(a, b, out=c)
    settle = max(1, round(SETTLE_MS / (per * call_ms)))
    timed = max(1, round(SUSTAINED_MS / (per * call_ms)))
    starved = True
    ms = 0.0
    for _attempt in range(2):
        marker = torch.cuda.Event()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(settle):
            graph.replay()
        marker.record()
        start.record()
        for _ in range(timed):
            graph.replay()
        end.record()
        starved = marker.query()  # the settling was over before the timed part was queued
        end.synchronize()
        ms = float(start.elapsed_time(end)) / (timed * per)
        if not starved:
            break
    del graph
    return {"bf16_tflops": flop / (ms * 1e-3) / 1e12, "bf16_sustained_calls": timed * per,
            "bf16_settle_calls": settle * per, "bf16_sustained_gap": starved}


def matmul(torch: Any, dev: Any, clock: GpuClock, busy: bool, n: int = 8192) -> dict[str, Any]:
    """Dense matmul throughput in TFLOP/s: bf16, fp32 with TF32 tensor cores, strict fp32.
    Few calls are enough for TF32 and fp32 (8192-wide matmuls vary by well under 1 % once
    warm); bf16, the MFU reference, is also run for ~250 ms and timed over the last ~100 ms,
    at the sustained clocks."""
    out: dict[str, Any] = {"n": n}
    flop = 2 * n**3
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype, tf32, iters in (("bf16", torch.bfloat16, False, 10), ("tf32", torch.float32, True, 6),
                                           ("fp32", torch.float32, False, 3)):
            if label == "bf16" and not torch.cuda.is_bf16_supported():
                out[label + "_tflops"] = None
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            ms = clock.time(lambda: a @ b, iters=iters, busy=busy)  # noqa: B023 (called in this iteration)
            out[label + "_tflops"] = flop / (ms * 1e-3) / 1e12
            if label == "bf16":
                # Ten calls (~14 ms on an H200) run at the clocks of a cool, idle GPU; a training
                # loop runs for seconds at the power limit, where the same kernel is slower. On
                # the H200 (benchmarks/matmul_sustained.py) 50 ms windows of these matmuls read
                # 768, 724, then 670-690 TFLOP/s from ~170 ms on; a 150 ms average that began
                # cool read 715-724, as did a settled run timed after a pause (the clock rises
                # again while the GPU waits), and a loop of bf16 matmuls reached 650 (90 % of it,
                # the bound). So the clock is let fall, then timed without a pause.
                # The figure %%gpuprofile's MFU is measured against is this sustained one.
                out["bf16_burst_tflops"] = out["bf16_tflops"]
                try:
                    out.update(sustained_matmul(torch, a, b, ms, flop))
                except Exception as exc:  # no CUDA graphs here: the same calls queued one by one
                    out["bf16_sustained_note"] = f"timed without a CUDA graph ({type(exc).__name__}: {exc})"[:300]
                    settle = min(max(round(SETTLE_MS / ms), 1), 300)
                    ms = clock.time(lambda: a @ b, iters=min(max(round(SUSTAINED_MS / ms), iters), 200),  # noqa: B023
                                    warmup=settle)
                    out["bf16_tflops"] = flop / (ms * 1e-3) / 1e12
            a = b = None  # free before the next dtype's pair
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    torch.cuda.empty_cache()
    return out


def copy_bandwidth(torch: Any, dev: Any, clock: GpuClock, busy: bool, mib: int = 64) -> dict[str, Any]:
    """Host-to-device copy GB/s from pinned and from pageable host memory, and device-to-host into
    pinned memory (64 MiB copies run at the link's full rate already). Pinned copies are timed on
    the GPU; pageable ones are staged by the host thread, so the host clock times them."""
    n_bytes = mib * 2**20
    out: dict[str, Any] = {"bytes": n_bytes}
    dst = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    pinned = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    ms = clock.time(lambda: dst.copy_(pinned, non_blocking=True), iters=8, busy=busy)
    out["pinned_gbps"] = n_bytes / (ms * 1e-3) / 1e9
    # the other direction, into pinned memory: the monitor's GPU->host limit line
    ms = clock.time(lambda: pinned.copy_(dst, non_blocking=True), iters=8, busy=busy)
    out["pinned_d2h_gbps"] = n_bytes / (ms * 1e-3) / 1e9
    pageable = torch.empty(n_bytes, dtype=torch.uint8).fill_(1)
    dst.copy_(pageable)
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for _ in range(4):
        dst.copy_(pageable)
    torch.cuda.synchronize(dev)
    out["pageable_gbps"] = 4 * n_bytes / (time.perf_counter() - t) / 1e9
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
    optimizer_import = None
    if "torch._dynamo" not in sys.modules and hasattr(torch, "_disable_dynamo"):
        optimizer_import = OptimizerImport()
    emit(event="step", step="cuda init", device=None)
    facts = torch_facts(torch)
    emit(event="facts", **facts)
    if not facts["cuda_available"]:
        emit(event="done")
        return 0
    targets = devices if devices is not None else [d["index"] for d in facts["devices"]]
    for i in targets:
        dev = torch.device("cuda", i)
        emit(event="step", step="context", device=i)
        try:
            t0 = time.perf_counter()
            torch.cuda.set_device(dev)
            torch.empty(1, device=dev)  # creates the CUDA context on this device
            torch.cuda.synchronize(dev)
            context_ms = (time.perf_counter() - t0) * 1e3
            clock = GpuClock(torch, dev)
        except Exception as exc:  # a GPU that cannot even start: say so for each measurement
            for name in ("smoke", "matmul", "copy"):
                emit(event="error", step=name, device=i, error=f"{type(exc).__name__}: {exc}"[:2000])
            continue
        # The GPU measurements first, while the optimizer import runs beside them; then the smoke
        # test, whose optimizer needs that import.
        # (each lambda is called in this iteration of the loop over devices: noqa B023)
        steps: tuple[tuple[str, Callable[[], dict[str, Any]]], ...] = (
            ("matmul", lambda: matmul(torch, dev, clock, busy=_busy(optimizer_import))),  # noqa: B023
            ("copy", lambda: copy_bandwidth(torch, dev, clock, busy=_busy(optimizer_import))),  # noqa: B023
            ("smoke", lambda: {"context_ms": context_ms, **smoke(torch, dev, clock, optimizer_import)}),  # noqa: B023
        )
        for name, fn in steps:
            emit(event="step", step=name, device=i)
            try:
                emit(event="result", step=name, device=i, **fn())
            except Exception as exc:  # report and go on: one failure must not hide the rest
                emit(event="error", step=name, device=i, error=f"{type(exc).__name__}: {exc}"[:2000])
                torch.cuda.empty_cache()
        optimizer_import = None  # paid once per process: later GPUs' smoke tests do not wait for it
    emit(event="done")
    return 0


def _busy(optimizer_import: OptimizerImport | None) -> bool:
    return optimizer_import is not None and optimizer_import.running


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
