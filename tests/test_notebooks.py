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


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def errors(nb) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path):
    nb = execute(path)
    assert errors(nb) == []
    texts = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                    for cell in nb.cells for o in cell.get("outputs", []))
    assert "gpunb" in texts or "GPU" in texts


def test_there_are_tutorials():
    assert NOTEBOOKS, "notebooks/ holds the guided tutorials"
