"""``gpunb.plan`` against the GPU itself: the planned peak vs ``torch.cuda.max_memory_allocated``.

Run on the GPU machine:
    python -m pytest -m gpu tests/gpu/test_plan_gpu.py -v
Each case is a fresh Python process (the allocator, cuBLAS's workspaces and cuDNN start clean):

1. the model is built on the GPU and planned there (stand-ins on ``cuda``): the plan allocates
   nothing (``memory_allocated`` and ``max_memory_allocated`` unchanged, the weights as they were);
2. the same model built on the CPU, as on a laptop, is planned too;
3. then it trains 3 real steps, each step's peak measured after ``reset_peak_memory_stats``.

Both plans must be within the band the plan ships (``calibration.UNDER`` below, 10 % above; the
goal is 3 % below, met by all but the wide fp32 MLP: the errors are in the JSON either way).
What was measured goes to ``$GPUNB_RESULTS/plan-gpu-*.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tests.gpu.results import save_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys
    sys.path[:0] = [%(root)r, %(bench)r]
    import torch, plan_zoo
    from gpunb.analysis.plan.planner import plan
    name, batch = %(name)r, %(batch)d
    cuda = torch.cuda
    model = plan_zoo.build(name, "cuda")
    weights = [p.detach().cpu().clone() for p in model.module.parameters()]  # on the host: no GPU memory
    cuda.synchronize()
    before = cuda.memory_allocated()
    cuda.reset_peak_memory_stats()
    on_gpu = plan(model.step, batch, gpus=[140])
    cuda.synchronize()
    out = {"model": name, "batch": batch, "problem": on_gpu.problem,
           "allocated_before": before, "allocated_after_plan": cuda.memory_allocated(),
           "max_allocated_during_plan": cuda.max_memory_allocated(),
           "weights_same": all(torch.equal(a, b.cpu()) for a, b in zip(weights, model.module.parameters())),
           "optimizer_state_after_plan": len(model.optimizer.state),
           "plan_gpu": {"step1": on_gpu.first_step_peak_bytes, "steady": on_gpu.steady_peak_bytes,
                        "reserved": on_gpu.peak_reserved_bytes, "seconds": on_gpu.seconds}}
    laptop = plan_zoo.build(name, "cpu")
    on_cpu = plan(laptop.step, batch, gpus=[140])
    out["plan_cpu"] = {"step1": on_cpu.first_step_peak_bytes, "steady": on_cpu.steady_peak_bytes,
                       "reserved": on_cpu.peak_reserved_bytes, "problem": on_cpu.problem}
    peaks, reserved = [], []
    for _ in range(3):
        cuda.reset_peak_memory_stats()
        model.step(batch)
        cuda.synchronize()
        peaks.append(cuda.max_memory_allocated())
        reserved.append(cuda.max_memory_reserved())
    out["measured"] = {"step1": peaks[0], "steady": max(peaks[1:]), "reserved": max(reserved), "peaks": peaks}
    print("RESULT " + json.dumps(out))
''')

CASES = [("mlp", 4096), ("transformer", 16), ("bf16_lm", 16), ("resnet50", 32), ("gpt2_small", 8)]


def _run(name: str, batch: int) -> dict:
    code = SCRIPT % {"root": str(ROOT), "bench": str(ROOT / "benchmarks"), "name": name, "batch": batch}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                          check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("name,batch", CASES)
def test_plan_against_max_memory_allocated(name, batch):
    out = _run(name, batch)
    measured = out["measured"]
    errors = {}
    for where in ("plan_gpu", "plan_cpu"):
        for key in ("step1", "steady"):
            errors[f"{where}_{key}"] = (out[where][key] - measured[key]) / measured[key]
    out["errors"] = errors
    save_json(f"plan-gpu-{name}-{batch}.json", out)
    assert not out["problem"] and not out["plan_cpu"]["problem"]
    # planning made no GPU memory and changed nothing
    assert out["allocated_after_plan"] == out["allocated_before"]
    # one 512 B block (torch's smallest) comes and goes during the plan on the H200 (run of 2026-12-05)
    assert out["max_allocated_during_plan"] - out["allocated_before"] <= 512
    assert out["weights_same"] and out["optimizer_state_after_plan"] == 0
    from gpunb.analysis.plan import calibration

    for key, err in errors.items():
        assert -calibration.UNDER <= err <= 0.10, (key, err, out)
