"""%%gpuprofile on the most common training cell: one that imports torch itself.

Each test runs in a fresh interpreter, where torch is not imported when the cell starts
(the test process itself has torch loaded by other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _run(script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "GPUNB_FAKE_NVML": "h200"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


TRAINING_CELL = '''
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
X = torch.randn(512, 16); y = (X[:, :4].sum(1) > 0).long()
dl = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.AdamW(model.parameters(), 1e-3)
for epoch in range(3):
    for xb, yb in dl:
        opt.zero_grad(); loss = nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
    print("epoch", epoch, round(loss.item(), 3))
'''


def test_a_cell_that_imports_torch_is_profiled_like_any_other():
    result = _run(f'''
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpunb")
        assert "torch" not in sys.modules, "the cell must be the first to import torch"
        hooks_before = list(sys.meta_path)
        cell = {TRAINING_CELL!r}
        r = ip.run_cell("%%gpuprofile -o prof\\n" + cell)
        p = ip.user_ns["prof"]
        again = ip.run_cell("%%gpuprofile -o prof2\\n" + cell)  # torch imported before this one
        q = ip.user_ns["prof2"]
        from torch.optim import optimizer as optim_module
        from torch.utils.data.dataloader import _BaseDataLoaderIter
        import torch
        print(json.dumps({{
            "success": r.success,
            "steps": p.steps.count,
            "batches": p.shares.batches,
            "batch_size": p.steps.batch_size,
            "syncs": p.shares.sync_by_method,
            "again": [again.success, q.steps.count, q.shares.batches, q.shares.sync_by_method],
            "param_devices": list(p.param_devices),
            "torch_version": p.torch_version,
            "gpu_absent": p.gpu_absent,
            "verdict": p.verdict.kind,
            "flops": p.flops.count.flops if p.flops is not None and p.flops.count is not None else None,
            "report": str(p),
            "post_hooks_left": len(optim_module._global_optimizer_post_hooks),
            "next_unwrapped": _BaseDataLoaderIter.__next__.__module__ != "gpunb.analysis.steps.instruments",
            "item_unwrapped": "item" not in torch.Tensor.__dict__,
            "meta_path_restored": sys.meta_path == hooks_before,
        }}))
    ''')
    assert result["success"]
    assert result["steps"] == 3 * 8 and result["batches"] == 3 * 8 and result["batch_size"] == 64
    # The same as when torch was imported before the cell: the same hooks saw the same calls.
    assert result["again"] == [True, 24, 24, result["syncs"]] and result["syncs"]["item"] >= 3
    assert result["param_devices"] == ["cpu"] and result["torch_version"].startswith("2.")
    assert result["flops"] and result["flops"] > 0  # step 2's FLOPs counted too, planned at the import
    assert "no optimizer.step() seen" not in result["report"]
    assert "torch is not imported" not in result["report"] and "CPU-only build" in result["gpu_absent"]
    assert result["verdict"] == "on-cpu"  # the fake NVML shows an H200 next to a CPU-only torch
    # Everything went back to how it was: no hook, wrapper or finder outlives the cell.
    assert result["post_hooks_left"] == 0 and result["next_unwrapped"] and result["item_unwrapped"]
    assert result["meta_path_restored"]


def test_a_cell_without_torch_leaves_no_watch_and_a_later_import_is_untouched():
    result = _run('''
        import json, sys
        import gpunb
        before = list(sys.meta_path)
        with gpunb.profile(show=False) as p:
            total = sum(range(1000))
        watch_gone = sys.meta_path == before
        import torch  # after the block: no hook may be put in now
        from torch.optim import optimizer as optim_module
        print(json.dumps({"watch_gone": watch_gone, "hooks": len(optim_module._global_optimizer_post_hooks),
                          "loader_real": type(torch.__loader__).__module__ != "gpunb.readings.import_watch",
                          "absent": p.result.gpu_absent}))
    ''')
    assert result["watch_gone"] and result["hooks"] == 0 and result["loader_real"]
    assert "torch is not imported" in result["absent"]
