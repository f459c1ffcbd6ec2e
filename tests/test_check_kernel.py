"""%gpucheck in a real Jupyter kernel (nbclient): progress updates one output in place,
which ends as the final HTML checklist (what a saved notebook and nbconvert show)."""

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_progress_then_final_report_in_one_output(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUNB_FAKE_NVML", "h200")  # the kernel inherits it: a recorded H200
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext gpunb"), nbformat.v4.new_code_cell("%gpucheck")]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[1].outputs
    assert [o.output_type for o in outputs] == ["display_data"]  # updated in place, not appended
    data = outputs[0].data
    assert data["text/plain"].splitlines()[1].startswith("gpunb check · ")
    assert "⏳" not in data["text/html"] and "<details" in data["text/html"]
    assert "NVIDIA H200" in data["text/html"]
    # The probe really ran (in a subprocess, with this machine's CPU torch): its verdict is in.
    assert "CPU-only build" in data["text/plain"]
