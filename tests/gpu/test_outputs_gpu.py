"""The outputs of issue 12 on a real GPU: a training cell that imports torch itself and puts
CUDA up inside the cell, the memory bar against torch's and NVML's own numbers, the monitor
frame drawn from real NVML readings.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_outputs_gpu.py -v
Measured figures are written as JSON into $GPUNB_RESULTS (default: a temp dir).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.gpu.results import save_json

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def _save(name: str, data: dict) -> None:
    save_json(f"outputs_{name}.json", data)


def test_a_cell_that_imports_torch_and_starts_cuda_is_profiled_with_cuda_events():
    """A fresh interpreter: torch is not imported when the cell starts, CUDA comes up inside it."""
    script = textwrap.dedent('''
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpunb")
        assert "torch" not in sys.modules
        cell = """%%gpuprofile -o prof
        import torch, torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        X = torch.randn(16384, 1024); y = torch.randint(0, 10, (16384,))
        dl = DataLoader(TensorDataset(X, y), batch_size=256, shuffle=True, pin_memory=True)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters(), 1e-3)
        for epoch in range(3):
            for xb, yb in dl:
                xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
                opt.zero_grad(); nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
        """
        r = ip.run_cell(cell)
        p = ip.user_ns["prof"]
        print(json.dumps({"success": r.success, "steps": p.steps.count, "source": p.steps.source,
                          "median_ms": p.steps.median_ms, "gpu": p.gpu is not None,
                          "peak_allocated": p.gpu.peak_allocated_bytes if p.gpu else None,
                          "max_allocated": __import__("torch").cuda.max_memory_allocated(),
                          "verdict": p.verdict.kind, "first_line": str(p).splitlines()[0]}))
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    _save("torch_imported_in_cell", r)
    assert r["success"] and r["steps"] == 3 * 64 and r["gpu"]
    assert r["source"].startswith("CUDA events")  # events began at the first step that found CUDA up
    assert r["peak_allocated"] == r["max_allocated"]  # CUDA started in the cell: the peak is the cell's
    assert r["first_line"].startswith("gpuprofile In [") and r["verdict"] in r["first_line"]


def test_memory_bar_matches_torch_and_nvml():
    import gpunb
    from gpunb.views.memory_view import memory_bar_html, memory_parts

    block = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    report = gpunb.memory(namespace={"block": block})
    row = report.gpus[0]
    parts = {w: n for w, n, _ in memory_parts(row)}
    _save("memory_bar", {"parts": parts, "row": row.to_dict()})
    assert parts["torch allocated"] == torch.cuda.memory_allocated(0) >= 2 * GiB
    assert parts["torch allocated"] + parts["reserved, not allocated"] == torch.cuda.memory_reserved(0)
    # the bar's parts make up the whole GPU (NVML's "used" is read a moment after torch's counters)
    assert abs(sum(parts.values()) - row.total_bytes) <= 64 * 2**20
    assert "free" in parts and abs(parts["free"] - (row.total_bytes - row.used_bytes)) == 0
    assert "torch allocated" in memory_bar_html(row)
    first = str(report).splitlines()[0]
    assert first.startswith("gpunb memory: GPU 0") and "used" in first
    del block


def test_monitor_frame_from_real_readings_is_complete_and_scaled_to_use():
    from gpunb.analysis.monitor.sampler import Sampler
    from gpunb.views.monitor_layout import monitor_html
    from tests.chart_html import images, svg_of

    sampler = Sampler(hz=4)
    block = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
    for _ in range(12):
        sampler.tick()
        time.sleep(0.25)
    page = monitor_html(sampler.window(10), state="stopped")
    charts = images(page, "gpunb-chart")
    _save("monitor_frame", {"charts": len(charts), "alts": [c["alt"] for c in charts], "bytes": len(page)})
    # five per GPU; CPU, RAM, PCIe both ways; NVLink where a GPU's links count their traffic
    nvlink = any(g.links is not None and g.links.nvlink is not None for g in sampler.window(10).gpus)
    assert len(charts) == 5 * len(sampler.gpus) + 2 + 2 + nvlink
    for chart_image in charts:
        svg_of(chart_image)  # every image is a well-formed SVG
    memory = charts[0]["alt"]
    assert "scale 0 to" in memory and "stopped at" in page
    del block
