"""FLOPs, MFU and --ops on a real GPU: a bf16 8192² matmul training loop must reach the MFU
that %gpucheck's measured bf16 peak predicts, and its top kernel must be the matmul.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_flops_gpu.py -v
Measured figures are written as JSON into $GPUNB_RESULTS (default: a temp dir).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import gpunb  # noqa: E402
from gpunb.readings import peak_cache, torch_state  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402

N, DEPTH = 8192, 8


def _save(name: str, data: dict) -> None:
    save_json(f"flops_{name}.json", data)


def _matmul_loop(dtype=torch.bfloat16):
    """Eight bias-free 8192² layers, batch 8192: 23 matmuls of 1.1 TFLOP a step (the first
    layer's input needs no gradient), little else (SGD, one small loss)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(N, N, bias=False) for _ in range(DEPTH)]).cuda().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(N, N, device="cuda", dtype=dtype)

    def run(steps: int) -> None:
        for _ in range(steps):
            loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    run(3)  # cuBLAS picks its kernels, the allocator fills
    torch.cuda.synchronize()
    return run


def test_bf16_matmul_loop_reaches_the_mfu_gpucheck_measured():
    report = gpunb.check(device=torch.cuda.current_device())  # the probe measures this GPU's bf16 peak
    uuid = torch_state.device_uuid(torch, torch.cuda.current_device())
    measured = peak_cache.lookup(uuid)
    assert measured is not None and measured.this_process, report["matmul_throughput"].summary
    run = _matmul_loop()
    with gpunb.profile(show=False, record=False) as p:
        run(30)
    r = p.result
    t = r.flops
    flops = (3 * DEPTH - 1) * 2 * N**3
    data = {"flops": t.count.flops, "expected_flops": flops, "by_precision": t.count.by_precision,
            "median_ms": r.steps.median_ms, "achieved_tflops": t.achieved_tflops, "mfu": t.mfu,
            "mfu_measured": t.mfu_measured, "measured_bf16_tflops": measured.tflops.get("bf16"),
            "datasheet_tflops": t.peak_tflops, "counted_step_host_ms": t.count.host_ms,
            "bandwidth_gbps": t.bandwidth_gbps, "memory_bound": t.memory_bound, "report": str(r)}
    _save("bf16_matmul_mfu", data)
    assert t.count.flops == flops and t.count.by_precision == {"bf16": flops}
    assert t.measured_source.startswith("%gpucheck in this kernel")
    assert t.peak_tflops is not None and t.mfu == pytest.approx(t.achieved_tflops / t.peak_tflops)
    # consistent with the measured peak: a loop of nothing but these matmuls runs at it, within 10 %
    assert 0.90 <= t.mfu_measured <= 1.10, data
    assert t.memory_bound is False
    assert "MFU" in str(r) and "measured by %gpucheck in this kernel" in str(r)


def test_ops_top_kernel_is_the_matmul(tmp_path):
    run = _matmul_loop()
    with gpunb.profile(show=False, record=False, ops=True, trace_dir=tmp_path) as p:
        run(10)
    o = p.result.ops
    data = {"shares": o.shares, "top_ops": [row.__dict__ for row in o.top_ops],
            "top_kernels": [row.__dict__ for row in o.top_kernels], "trace_bytes": o.trace_bytes,
            "processing_s": o.processing_s, "note": o.note, "excluded": p.result.steps.excluded}
    _save("ops_matmul", data)
    assert o.device_time and o.steps == (3, 4, 5)
    assert o.top_kernels[0].category == "matmul", data
    assert o.top_ops[0].name in ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear"), data
    assert o.shares["matmul"] > 0.8 and o.shares["idle"] < 0.1, data
    trace = json.loads(Path(o.trace_path).read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])


def test_tf32_and_fp32_matmuls_are_told_apart():
    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for allowed, precision in ((True, "tf32"), (False, "fp32")):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            with gpunb.profile(show=False, record=False) as p:
                for _ in range(4):
                    model(x).sum().backward()
                    opt.step()
            assert set(p.result.flops.count.by_precision) == {precision}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_counting_costs_at_most_one_step_on_a_launch_bound_loop():
    """The counted step runs every operation through a Python dispatch mode. On a launch-bound
    loop (the overhead benchmark's small MLP), what that adds to a cell must stay within one
    step's time: step 2 of cells that count against step 2 of cells that do not, side by
    side (an early step is slower than the median anyway, counted or not)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from training_loops import build_loop  # the overhead benchmarks' loops, defined once
    finally:
        sys.path.pop(0)
    loop = build_loop("launch-bound", "cuda")
    loop.run(20)
    loop.sync()
    second: dict[bool, list[float]] = {True: [], False: []}  # step 2's host ms, by counting
    medians = []
    ops = host_ms = None
    for _ in range(7):
        for flops in (True, False):
            with gpunb.profile(show=False, record=False, flops=flops) as p:
                loop.run(100)
            marks = p.result.step_marks_s
            second[flops].append((marks[1] - marks[0]) * 1e3)
            if flops:
                ops, host_ms = p.result.flops.count.ops, p.result.flops.count.host_ms
            else:
                medians.append(p.result.steps.median_ms)
    cost = statistics.median(second[True]) - statistics.median(second[False])
    step_ms = statistics.median(medians)
    _save("counting_cost_launch_bound", {"step2_counted_ms": second[True], "step2_plain_ms": second[False],
                                         "counting_cost_ms": cost, "median_step_ms": step_ms,
                                         "cost_in_steps": cost / step_ms, "counted_host_ms": host_ms,
                                         "ops_per_step": ops})
    assert cost <= step_ms, (cost, step_ms, second)
