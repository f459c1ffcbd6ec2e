"""A real kernel via nbclient: the saved notebook and its nbconvert HTML keep the
monitor's charts (live: the widget bundle's text/html fallback; stopped: the snapshot
that replaced the widget through its display handle)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _execute(cells: list[str], monkeypatch, tmp_path, store_widget_state: bool = True) -> nbformat.NotebookNode:
    monkeypatch.setenv("GPUNB_FAKE_NVML", "h200")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", store_widget_state=store_widget_state,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    return nb


def test_stopped_monitor_leaves_a_snapshot_in_the_saved_notebook_and_its_html(monkeypatch, tmp_path):
    nb = _execute(
        [
            "%load_ext gpunb\n%gpumonitor --hz 10 --window 30 -o mon",
            "import time\ntime.sleep(1.5)\nlen(mon.samples()['t_s']) > 5",
            "%gpumonitor --stop",
        ],
        monkeypatch,
        tmp_path,
    )
    first = nb.cells[0].outputs
    assert len(first) == 1 and first[0].output_type == "display_data"
    data = first[0].data
    assert WIDGET_VIEW not in data  # the widget was replaced by its snapshot
    assert "<svg" in data["text/html"] and "stopped" in data["text/html"] and "NVIDIA H200" in data["text/html"]
    assert "GPU0 NVIDIA H200" in data["text/plain"]
    assert nb.cells[1].outputs[0].data["text/plain"] == "True"
    assert "stopped 1 monitor(s)" in nb.cells[2].outputs[0].text

    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    assert body.count('class="gpunb-spark"') == 7


@pytest.mark.parametrize("store_widget_state", [False, True])
def test_live_monitor_output_carries_an_html_fallback(monkeypatch, tmp_path, store_widget_state):
    nb = _execute(["%load_ext gpunb\n%gpumonitor"], monkeypatch, tmp_path, store_widget_state)
    data = nb.cells[0].outputs[0].data
    assert WIDGET_VIEW in data  # a widget frontend draws the live widget...
    assert "<svg" in data["text/html"] and "live at 2 Hz" in data["text/html"]  # ...the rest the snapshot
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    if store_widget_state:
        # With saved widget state nbconvert embeds the widget, whose saved value is the SVG.
        assert 'class=\\"gpunb-spark\\"' in body
    else:
        # JupyterLab saves no widget state by default: nbconvert shows the text/html snapshot.
        assert body.count('class="gpunb-spark"') == 7
