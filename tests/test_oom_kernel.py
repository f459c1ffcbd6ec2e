"""In a real ipykernel (nbclient): the failed cell keeps its error (status, ename, traceback),
the OOM doctor's diagnosis follows it, and the next cell finds the pinned object freed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    "%load_ext gpunb",
    "import json, torch, weakref\n"
    "from gpunb.testing.fake_nvml import load_trace\n"
    "MSG = load_trace()['oom_message']\n"
    "class Pinned:\n"
    "    pass\n"
    "refs = []",
    "def train_step(bs):\n"
    "    acts = torch.zeros(bs, 256)\n"
    "    p = Pinned(); refs.append(weakref.ref(p))\n"
    "    raise torch.OutOfMemoryError(MSG)\n"
    "train_step(1024)",
    "import gc; gc.collect()\n"
    "print('RESULT ' + json.dumps({'freed': refs[0]() is None}))",
]


def test_real_kernel_shows_the_error_then_the_diagnosis_and_frees():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    failed = nb.cells[2].outputs
    kinds = [o["output_type"] for o in failed]
    assert "error" in kinds, failed
    err = failed[kinds.index("error")]
    assert err["ename"] == "OutOfMemoryError" and "Tried to allocate 30.00 GiB" in err["evalue"]
    assert any("train_step" in line for line in err["traceback"])
    shown = [o for o in failed if o["output_type"] == "display_data"]
    assert shown and "gpunb OOM doctor" in shown[0]["data"]["text/plain"]
    assert "&lt;" not in shown[0]["data"]["text/plain"] and "<b>gpunb OOM doctor</b>" in shown[0]["data"]["text/html"]
    assert kinds.index("error") < kinds.index("display_data")  # the diagnosis comes below the traceback
    out = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert json.loads(out.split("RESULT ", 1)[1])["freed"] is True
