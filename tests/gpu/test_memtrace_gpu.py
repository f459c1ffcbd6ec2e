"""``%%gpumem --trace`` and the OOM doctor with stacks on a real GPU, in IPython.

Run on the GPU machine:
    python -m pytest -m gpu tests/gpu/test_memtrace_gpu.py -v
Each scenario runs in a fresh Python process driving an IPython shell (``run_cell``, as a
notebook does), so its CUDA memory and torch's peak counter start clean. What was measured
goes to ``$GPUNB_RESULTS/memtrace-*.json``.

- a cell whose biggest allocation is on a known line: the top line at the peak is that line;
  a module file of the user's, called from the cell, is named by its file and line;
- the timeline's peak equals ``torch.cuda.max_memory_allocated()`` over the cell;
- ``--save`` writes the pickle memory_viz opens; the history is off again after the cell;
- ``%gpumem --trace on``, then an OOM: the doctor names the failing line and the line holding
  the most memory, and still gives back all the memory the failed cell held (as unarmed).
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
pytest.importorskip("IPython")

from tests.gpu.results import RESULTS, save_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MiB, GiB = 2**20, 2**30

# A module file of the user's: its allocation must be named by file and line, not folded as library code.
USER_MODULE = '''\
import torch

def make_buffer(n_mib):
    scratch = torch.empty(n_mib * 2**20, dtype=torch.uint8, device="cuda")  # line 4
    return scratch
'''

TRACE_SCRIPT = '''
import json, os, pickle, sys, tempfile
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "gpunb")
out = {}
ok = ip.run_cell("""import sys, torch, torch.nn as nn
sys.path.insert(0, %(moddir)r)
import usermod
model = nn.Sequential(nn.Linear(2048, 8192), nn.ReLU(), nn.Linear(8192, 2048)).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(4096, 2048, device="cuda")
torch.cuda.synchronize()""")
out["setup_ok"] = ok.success
torch = ip.user_ns["torch"]
save = os.path.join(tempfile.mkdtemp(), "cell.pickle")
cell = f"""%%%%gpumem --trace --save {save} -o t
loss = model(x).square().mean()
big = torch.empty(1536 * 2**20, dtype=torch.uint8, device="cuda")
side = usermod.make_buffer(768)
loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
del loss"""
r = ip.run_cell(cell)
out["cell_ok"] = r.success
out["cell_number"] = r.execution_count
t = ip.user_ns["t"]
out["trace"] = t.to_dict()
out["text"] = str(t)
out["html_bytes"] = len(t._repr_mimebundle_()["text/html"])
out["max_memory_allocated_after"] = torch.cuda.max_memory_allocated()
out["history_on_after"] = bool(torch._C._cuda_isHistoryEnabled())
with open(save, "rb") as f:
    snap = pickle.load(f)
out["saved_events"] = len(snap["device_traces"][torch.cuda.current_device()])
out["saved_size"] = os.path.getsize(save)
r = ip.run_cell("""del big, side
import gpunb
with gpunb.trace_memory(show=False) as api:
    y = torch.empty(900 * 2**20, dtype=torch.uint8, device="cuda")
    z = y.float()
    del y, z
api_torch_peak = torch.cuda.max_memory_allocated()""")
out["api_ok"] = r.success
out["api_cell_number"] = r.execution_count
out["api"] = ip.user_ns["api"].to_dict()
out["api_torch_peak"] = ip.user_ns["api_torch_peak"]
print("RESULT " + json.dumps(out, default=str))
'''

OOM_SCRIPT = '''
import json, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "gpunb")
# store_history=True, as a notebook runs its cells: each cell its own In [n]
# (without it IPython compiles every cell under the same number, its tracebacks say so too)
setup = ip.run_cell("""import torch
torch.cuda.init()
torch.cuda.set_per_process_memory_fraction(20 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
def grab():
    keep = torch.empty(12 * 2**30, dtype=torch.uint8, device="cuda")
    more = torch.empty(10 * 2**30, dtype=torch.uint8, device="cuda")
    return keep, more""", store_history=True)
kernel = ip._gpunb_extension_state.kernel
out = {"setup_cell": setup.execution_count}
for armed in (False, True):
    if armed:
        ip.run_line_magic("gpumem", "--trace on")
    before = torch_alloc = ip.user_ns["torch"].cuda.memory_allocated()
    r = ip.run_cell("pair = grab()", store_history=True)
    d = kernel.last_oom
    torch = ip.user_ns["torch"]
    key = "armed" if armed else "unarmed"
    out[key] = {
        "cell_failed": not r.success,
        "cell_number": r.execution_count,
        "diagnosed": d is not None,
        "text": str(d) if d is not None else "",
        "sites": d.alloc_sites.to_dict() if d is not None and d.alloc_sites is not None else None,
        "returned_fraction": d.release.returned_fraction if d is not None and d.release is not None else None,
        "allocated_before": before,
        "allocated_after": torch.cuda.memory_allocated(),
    }
    kernel.last_oom = None
ip.run_line_magic("gpumem", "--trace off")
out["history_on_after_off"] = bool(torch._C._cuda_isHistoryEnabled())
# 16 GiB under the 20 GiB cap: fits only if the failed cell's 12 GiB really came back. max(), not
# sum(): sum() of uint8 makes an int64 copy first (8 bytes a byte: 32 GiB for 4 GiB), over the cap.
r = ip.run_cell("ok = torch.ones(16 * 2**30, dtype=torch.uint8, device='cuda').max().item() == 1",
                store_history=True)
out["next_cell_ok"] = r.success and ip.user_ns.get("ok") is True
out["next_cell_error"] = repr(r.error_in_exec or r.error_before_exec) if not r.success else None
out["next_cell_diagnosis"] = str(kernel.last_oom) if kernel.last_oom is not None else None
print("RESULT " + json.dumps(out, default=str))
'''


def _run(script: str, tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_traced_cell_names_the_lines_and_its_peak_is_torchs(tmp_path):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "usermod.py").write_text(USER_MODULE)
    out = _run(textwrap.dedent(TRACE_SCRIPT) % {"moddir": str(moddir)}, tmp_path)
    save_json("memtrace-cell.json", out)
    assert out["setup_ok"] and out["cell_ok"], out
    t = out["trace"]
    assert not t["unavailable"], t["unavailable"]
    sites = t["sites_at_peak"]
    n = out["cell_number"]
    # the biggest allocation (1.5 GiB) is the top line at the peak, named as the user sees it
    assert sites[0]["label"].startswith(f"In [{n}] line 3: big = torch.empty("), sites[:3]
    assert sites[0]["nbytes"] == 1536 * MiB
    # the user's module file: its own line, the cell's call as its caller
    mine = [s for s in sites if s["label"].startswith("usermod.py line 4:")]
    assert mine and mine[0]["nbytes"] == 768 * MiB, sites
    assert mine[0]["stack"] == [f"In [{n}] line 4: side = usermod.make_buffer(768)", mine[0]["label"]], mine[0]
    # the timeline's peak is torch's peak over the cell (the trace reset the counter at the start)
    assert t["peak_bytes"] == t["torch_peak_bytes"] == out["max_memory_allocated_after"], (t["peak_bytes"], t["notes"])
    # roles: parameters were there before, Adam made its state, the forward pass its activations
    assert t["peak_by_role"]["optimizer state"] > 0 or t["peak_by_role"]["activations"] > 0, t["peak_by_role"]
    assert out["saved_size"] > 0 and out["saved_events"] >= t["events"]  # the file also has the segment events
    assert not out["history_on_after"], "the history must be off again after the traced cell"
    assert out["text"].startswith("gpunb memory trace")
    assert out["api_ok"], out
    api = out["api"]
    assert api["peak_bytes"] == api["torch_peak_bytes"] == out["api_torch_peak"], api
    top = api["sites_at_peak"]
    k = out["api_cell_number"]
    assert top[0]["label"] == f"In [{k}] line 5: z = y.float()" and top[0]["nbytes"] == 4 * 900 * MiB, top[:2]
    assert top[1]["label"].startswith(f"In [{k}] line 4: y = torch.empty(900") and top[1]["nbytes"] == 900 * MiB


def test_armed_oom_doctor_names_the_lines_and_still_frees_everything(tmp_path):
    out = _run(textwrap.dedent(OOM_SCRIPT), tmp_path)
    save_json("memtrace-oom.json", out)
    un, armed = out["unarmed"], out["armed"]
    for case in (un, armed):
        assert case["cell_failed"] and case["diagnosed"], case
        assert case["allocated_after"] == case["allocated_before"], case  # all of it came back
    assert un["sites"] is None  # off unless asked
    sites = armed["sites"]
    assert "more = torch.empty(10 * 2**30" in sites["failed_at"], sites
    assert sites["requested_bytes"] == 10 * GiB
    assert "keep = torch.empty(12 * 2**30" in sites["live"][0]["label"] and sites["live"][0]["nbytes"] == 12 * GiB
    assert "Failed request" in armed["text"] and "more = torch.empty" in armed["text"]
    assert armed["returned_fraction"] == un["returned_fraction"], (armed["returned_fraction"], un["returned_fraction"])
    # each line named by the cell it is in: grab() was defined in the setup cell, called in the armed one
    n_def, n_call = out["setup_cell"], armed["cell_number"]
    assert n_def != n_call, (n_def, n_call)
    assert sites["failed_at"].startswith(f"In [{n_def}] line 6: more = torch.empty("), sites
    assert sites["failed_stack"][0] == f"In [{n_call}] line 1: pair = grab()", sites
    assert sites["live"][0]["label"].startswith(f"In [{n_def}] line 5: keep = torch.empty("), sites
    assert not out["history_on_after_off"]
    assert out["next_cell_ok"], (out["next_cell_error"], out["next_cell_diagnosis"])
    assert RESULTS.exists()
