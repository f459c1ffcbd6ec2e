"""The tutorial notebooks, executed on a real GPU (the same notebooks CI runs on the CPU).

The executed notebooks are saved into $GPUNB_RESULTS so their outputs can be read.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tests.gpu.results import RESULTS  # noqa: E402
from tests.test_notebooks import NOTEBOOKS, errors, execute, unfinished_cell, untrue_sentences  # noqa: E402


def _gpu_count() -> int:
    from gpunb.readings.nvml import NvmlSession

    return NvmlSession().device_count()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_on_the_gpu(path):
    if path.name == "05-multi-gpu.ipynb" and _gpu_count() >= 2:
        pytest.skip("run with its multi-GPU checks by tests/gpu/test_multi_gpu.py::test_tutorial_05_on_two_gpus")
    nb = nbformat.read(path, as_version=4)
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        execute(path, timeout=900, nb=nb)
    except Exception as exc:  # a dead kernel names no cell: the saved notebook and this line do (run 3: 04 died)
        raise AssertionError(f"{type(exc).__name__} in {unfinished_cell(nb)}") from exc
    finally:
        nbformat.write(nb, RESULTS / f"executed-{path.name}")
    assert errors(nb) == []
    text = "".join(str(o.get("text", "")) for cell in nb.cells for o in cell.get("outputs", []))
    assert "training on cuda" in text or path.name != "01-setup-checklist.ipynb"
    # the text around each output says what a GPU shows (tests/test_notebooks.py: TRUE_IN, FALSE_IN)
    assert untrue_sentences(nb, path.name, "gpu") == []
