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
    *cancel, report = nb.cells[1].outputs
    # progress updated in place into the report, not appended; the Cancel button (where the
    # kernel has subshells for its click) gave way to an empty output when the check ended
    assert report.output_type == "display_data" and all(o.data == {"text/plain": ""} for o in cancel)
    assert len(cancel) <= 1
    data = report.data
    assert data["text/plain"].splitlines()[1].startswith("gpunb check · ")  # line 1: the finding
    assert "⏳" not in data["text/html"] and "<details" in data["text/html"]
    assert "NVIDIA H200" in data["text/html"]
    # The probe really ran (in a subprocess, with this machine's CPU torch): its verdict is in.
    assert "CPU-only build" in data["text/plain"]
