"""The OOM doctor and %gpufit on a real GPU, in real kernels driven by nbclient.

Run on the GPU machine (see ../shared/gpu-box/README.md):
    python -m pytest -m gpu tests/gpu/test_oom_gpu.py -v
Results (JSON per scenario, PNG memory curves) go to $GPUNB_RESULTS (default: a temp dir).

Scenarios, each in a fresh kernel:
- too-large batch: an MLP step at a batch whose input alone is ~65 GB;
- leftovers: a 75 %-of-free tensor left from an earlier cell plus a CUDA tensor in Out[n];
  the step would fit without them (proved by running it after ``%gpumem --free``);
- fragmentation: 1 GiB pieces carved from one cached 20 GiB segment, every other one
  freed, then a 6 GiB request under a 24 GiB ``set_per_process_memory_fraction`` cap.
For each, the diagnosis must name the cause, and the memory the failed cell held must come
back (>= 95 %) without restarting the kernel: the next cell trains again.

%gpufit runs on an MLP and a small transformer under a per-process cap
(``set_per_process_memory_fraction``, env GPUNB_FIT_FRACTION, default 0.25 of the H200 ≈ 35 GB)
so that every search (gpufit, brute force, Lightning power, accelerate halving) takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from tests.gpu.results import RESULTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS.mkdir(parents=True, exist_ok=True)
FIT_FRACTION = float(os.environ.get("GPUNB_FIT_FRACTION", "0.25"))
GiB = 2**30


def _kernel_name() -> str:
    """python3 if a kernelspec (or ipykernel's built-in one) exists; else install one for this Python."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
        return "python3"
    except NoSuchKernel:
        import subprocess

        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "gpunb-test"], check=True,
                       capture_output=True)
        return "gpunb-test"


PRELUDE = f"""
import gc, json, os, sys
import torch
sys.path.insert(0, {str(HERE)!r})
torch.backends.cuda.matmul.allow_tf32 = True
dev = torch.device("cuda")
GiB = 2**30
def kernel_state():
    return get_ipython()._gpunb_extension_state.kernel
def nvml_proc():
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.nvml import default_session
    s = default_session()
    return read_ownership(s, read_device_map(s, torch=torch).nvml_index(0)).self_bytes
"""

MLP = """
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU())
                              for _ in range(8)]).to(dev)
opt = torch.optim.AdamW(model.parameters())
def train_step(bs):
    opt.zero_grad(set_to_none=True)
    x = torch.randn(bs, 4096, device=dev)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
train_step(256); torch.cuda.synchronize()
"""

REPORT = """
gc.collect()
d = kernel_state().last_oom
after = torch.cuda.memory_allocated()
held = d.message.allocated_bytes - base_alloc
print("RESULT " + json.dumps({
    "diagnosis": d.to_dict(), "base_alloc": base_alloc, "oom_alloc": d.message.allocated_bytes,
    "after_alloc": after, "held_by_failed_cell": held,
    "returned_fraction": (d.message.allocated_bytes - after) / held,
    "base_proc": base_proc, "after_proc": nvml_proc(), "reserved_after": torch.cuda.memory_reserved(),
}))
"""

TRAIN_AGAIN = """
train_step(256); torch.cuda.synchronize()
print("RESULT " + json.dumps({"trained_again": True, "alloc": torch.cuda.memory_allocated()}))
"""


def run_notebook(cells: list[str], name: str, timeout: int = 300):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=_kernel_name(), allow_errors=True,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    nbformat.write(nb, RESULTS / f"oom_{name}.ipynb")
    return nb


def cell_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(out["ename"] + ": " + out["evalue"] + "\n" + "\n".join(out["traceback"]))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def result_of(cell) -> dict:
    text = cell_text(cell)
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in cell output:\n{text[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def save(name: str, data: dict) -> None:
    (RESULTS / f"oom_{name}.json").write_text(json.dumps(data, indent=1, default=str))


def _assert_failed_cell_shows_traceback_then_diagnosis(cell, cause: str) -> None:
    errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
    assert errors and errors[0]["ename"] == "OutOfMemoryError", cell_text(cell)[-2000:]
    text = cell_text(cell)
    # the cause in the reader's words (its code, e.g. "working-set", is in the data: d["causes"])
    assert "gpunb OOM doctor" in text and "Why: " in text and "What to do" in text, (cause, text[-4000:])


def test_oom_from_a_too_large_batch_is_diagnosed_and_memory_returned():
    nb = run_notebook([
        "%load_ext gpunb", PRELUDE, MLP,
        "base_alloc = torch.cuda.memory_allocated(); base_proc = nvml_proc()",
        "train_step(4_000_000)  # the input alone is 65 GB, the first layer's output another 65",
        REPORT, TRAIN_AGAIN,
    ], "too_large_batch")
    _assert_failed_cell_shows_traceback_then_diagnosis(nb.cells[4], "working-set")
    r = result_of(nb.cells[5])
    save("too_large_batch", r)
    d = r["diagnosis"]
    assert d["causes"][0]["code"] == "working-set"
    assert d["fixes"][0]["title"] == "Use a smaller batch"
    assert any(e["name"] == "train_step() local x" and e["source"] == "failed cell" for e in d["census"]["entries"])
    assert r["held_by_failed_cell"] > 50 * GiB
    assert r["returned_fraction"] >= 0.95, r
    assert result_of(nb.cells[6])["trained_again"]


def test_oom_from_leftovers_of_earlier_cells_names_them():
    nb = run_notebook([
        "%load_ext gpunb", PRELUDE, MLP,
        # per-sample memory of a step, then a batch that needs half of what is free
        # (batches large enough that activations, not the optimizer step, set the peak)
        "torch.cuda.reset_peak_memory_stats(); train_step(16384); p1 = torch.cuda.max_memory_allocated()\n"
        "torch.cuda.reset_peak_memory_stats(); train_step(32768); p2 = torch.cuda.max_memory_allocated()\n"
        "per_sample = (p2 - p1) / 16384\n"
        "assert per_sample > 0, (p1, p2)\n"
        "gc.collect(); torch.cuda.empty_cache()\n"
        "bs = int(0.5 * torch.cuda.mem_get_info()[0] / per_sample)\n"
        "print('RESULT', json.dumps({'per_sample': per_sample, 'bs': bs}))",
        "junk = torch.empty(int(0.75 * torch.cuda.mem_get_info()[0]), dtype=torch.uint8, device=dev)",
        "torch.ones(256, 1024, 1024, device=dev)  # 1 GiB kept alive by the output history",
        "base_alloc = torch.cuda.memory_allocated(); base_proc = nvml_proc()",
        "train_step(bs)",
        REPORT,
        "before = torch.cuda.memory_allocated()\n%gpumem --free junk\n"
        "print('RESULT', json.dumps({'freed': before - torch.cuda.memory_allocated(), 'junk': junk_size}))"
        .replace("junk_size", "kernel_state().last_oom.census.find('junk').nbytes"),
        "train_step(bs); torch.cuda.synchronize(); print('RESULT', json.dumps({'fits_without_leftovers': True}))",
    ], "leftovers")
    _assert_failed_cell_shows_traceback_then_diagnosis(nb.cells[7], "leftovers")
    r = result_of(nb.cells[8])
    d = r["diagnosis"]
    save("leftovers", {**r, "setup": result_of(nb.cells[3])})
    codes = [c["code"] for c in d["causes"]]
    assert codes[0] == "leftovers", codes
    assert "junk" in d["causes"][0]["summary"]
    assert any(e["name"] == "junk" and e["source"] == "earlier cells" for e in d["census"]["entries"])
    assert d["release"]["output_entries"], "the CUDA tensor in Out[n] was released"
    assert any("%gpumem --free junk" in f["how"] for f in d["fixes"])
    assert r["returned_fraction"] >= 0.95, r
    # %gpumem --free junk gave the leftover back (the cell prints the magic's report too)
    text = cell_text(nb.cells[9])
    freed = json.loads([x for x in text.splitlines() if x.startswith("RESULT")][-1][7:])
    assert freed["freed"] >= 0.99 * freed["junk"]
    assert result_of(nb.cells[10])["fits_without_leftovers"]


def test_oom_from_fragmentation_is_named_and_released(monkeypatch):
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # expandable segments would prevent it
        monkeypatch.delenv(name, raising=False)
    nb = run_notebook([
        "%load_ext gpunb", PRELUDE,
        "torch.cuda.set_per_process_memory_fraction(24 * GiB / torch.cuda.mem_get_info()[1])\n"
        "def fragment():\n"
        "    big = torch.empty(20 * GiB, dtype=torch.uint8, device=dev)\n"
        "    del big  # one cached 20 GiB segment\n"
        "    pieces = [torch.empty(GiB, dtype=torch.uint8, device=dev) for _ in range(20)]  # carved from it\n"
        "    del pieces[::2]  # 10 one-GiB holes, none can take 6 GiB\n"
        "    return torch.empty(6 * GiB, dtype=torch.uint8, device=dev)\n"
        "torch.cuda.synchronize(); base_alloc = torch.cuda.memory_allocated(); base_proc = nvml_proc()",
        "out = fragment()",
        REPORT,
        "x = torch.empty(6 * GiB, dtype=torch.uint8, device=dev); del x\n"
        "print('RESULT', json.dumps({'six_gib_fits_now': True}))",
    ], "fragmentation")
    _assert_failed_cell_shows_traceback_then_diagnosis(nb.cells[3], "fragmentation")
    r = result_of(nb.cells[4])
    save("fragmentation", r)
    d = r["diagnosis"]
    assert d["causes"][0]["code"] == "fragmentation", d["causes"]
    assert d["message"]["reserved_unallocated_bytes"] >= 9 * GiB
    assert d["fixes"][0]["title"] == "Turn on expandable segments"
    assert r["returned_fraction"] >= 0.95, r
    assert r["reserved_after"] < GiB  # the split segment went back to the driver
    assert result_of(nb.cells[5])["six_gib_fits_now"]


FIT_MODELS = {
    "mlp": """
model = torch.nn.Sequential(torch.nn.Linear(1024, 32768), torch.nn.GELU(), torch.nn.Linear(32768, 1024),
                            torch.nn.Linear(1024, 32768), torch.nn.GELU(), torch.nn.Linear(32768, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters())
def step(bs):
    opt.zero_grad(set_to_none=True)
    x = torch.randn(bs, 1024, device=dev)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
""",
    "transformer": """
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).to(dev)
opt = torch.optim.AdamW(model.parameters())
def step(bs):
    opt.zero_grad(set_to_none=True)
    x = torch.randn(bs, 1024, 512, device=dev)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
""",
}


FIT_STEPS = 5  # the magic's path in a real kernel; sustained 50-step runs are tests/gpu/test_batch_fit_zoo_gpu.py's


@pytest.mark.parametrize("model", sorted(FIT_MODELS))
def test_gpufit_in_a_kernel_recommends_a_batch_that_trains_within_15_percent(model):
    nb = run_notebook([
        "%load_ext gpunb", PRELUDE,
        f"torch.cuda.set_per_process_memory_fraction({FIT_FRACTION})\n" + FIT_MODELS[model],
        f"%gpufit step --steps {FIT_STEPS} -o fit",
        "import oom_kernel_helpers as h\n"
        f"r = h.compare(step, fit, steps={FIT_STEPS})\n"
        f"fit.figure().savefig(os.path.join({str(RESULTS)!r}, 'gpufit_{model}.png'))\n"
        "print('RESULT ' + json.dumps(r, default=str))",
    ], f"gpufit_{model}", timeout=600)
    shown = cell_text(nb.cells[3])
    assert "recommended batch:" in shown, shown[-3000:]
    r = result_of(nb.cells[4])
    r["fraction_cap"] = FIT_FRACTION
    save(f"gpufit_{model}", r)
    fit, truth = r["gpufit"], r["brute_force"]["true_max"]
    assert fit["ok"] and fit["recommended"] <= truth and r["recommended_trains"]
    # the recommendation keeps the allocator's measured overhead free, so it sits a little under
    # the largest batch that squeezes through a short run with the cache given back
    assert fit["recommended"] >= 0.85 * truth, (fit["recommended"], truth, fit["trials"])
    assert fit["trial_count"] <= 6, fit["trials"]
