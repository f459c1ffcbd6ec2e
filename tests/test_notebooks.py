"""Every tutorial notebook runs top to bottom in a real kernel (nbclient) without an error.

On CI there is no GPU: the notebooks must still run and say what is missing. The same test
runs on the GPU machine (tests/gpu/test_notebooks_gpu.py) where they use the GPU.
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.notebooks
# On the CPU, notebook 5 sees the two H200s of the lent 2-GPU machine as the fake NVML replays
# them (links, peer access): its multi-GPU check and per-rank profile then run their real
# subprocess paths, over gloo.
CPU_ENV = {"05-multi-gpu.ipynb": {"GPUNB_FAKE_NVML": "h200x2-nvlink"}}
CPU_SHOWS = {"05-multi-gpu.ipynb": ("NVLink 4.0 × 18 through NVSwitch", "2 ranks over gloo", "every element of the sum",
                                    "2 ranks reported", "weights identical on every rank: True", "kernel_cuda: ok")}


def execute(path: Path, timeout: int = 600, nb: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` (or ``nb``, read from it: nbclient fills it in place, so a
    caller that passes its own keeps the outputs up to a failure)."""
    nb = nb if nb is not None else nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def unfinished_cell(nb) -> str:
    """The cell a run stopped in (started, no reply): its index and first line."""
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "shell.execute_reply" not in timing:
            return f"cell {i}: {cell.source.splitlines()[0] if cell.source else ''}"
    return "no cell was left unfinished"


def errors(nb) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def texts(nb) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for cell in nb.cells for o in cell.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path, monkeypatch):
    for key, value in CPU_ENV.get(path.name, {}).items():
        monkeypatch.setenv(key, value)  # the kernel nbclient starts inherits it
    nb = execute(path)
    assert errors(nb) == []
    out = texts(nb)
    assert "gpunb" in out or "GPU" in out
    for seen in CPU_SHOWS.get(path.name, ()):
        assert seen in out, seen


def test_there_are_tutorials():
    assert NOTEBOOKS, "notebooks/ holds the guided tutorials"
