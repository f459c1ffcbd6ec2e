"""A real kernel via nbclient: the saved notebook and its nbconvert HTML keep the monitor's
charts, live or stopped; the frame that stays is the latest, redrawn while later cells ran."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from tests.chart_html import images

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# ipywidgets is a dependency; an environment set up before it became one shows no controls
HAS_WIDGETS = importlib.util.find_spec("ipywidgets") is not None


def _execute(cells: list[str], monkeypatch, tmp_path) -> nbformat.NotebookNode:
    monkeypatch.setenv("GPUNB_FAKE_NVML", "h200")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def _exported(nb) -> str:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    return body


def test_stopped_monitor_leaves_its_last_frame_in_the_saved_notebook_and_its_html(monkeypatch, tmp_path):
    nb = _execute(
        [
            "%load_ext gpunb\n%gpumonitor --hz 10 --window 30 -o mon",
            "import time\ntime.sleep(1.5)\nlen(mon.samples()['t_s']) > 5",
            "%gpumonitor --stop",
        ],
        monkeypatch,
        tmp_path,
    )
    *controls, frame = nb.cells[0].outputs
    # the controls gave way to nothing when the monitor stopped (an empty text): no widget is saved
    assert [c.data for c in controls] == ([{"text/plain": ""}] if HAS_WIDGETS else [])
    assert frame.output_type == "display_data"
    data = frame.data
    assert WIDGET_VIEW not in data and "<svg" not in data["text/html"]
    html = data["text/html"]
    # five GPU charts, CPU and RAM, PCIe both ways
    assert len(images(html, "gpunb-chart")) == 9 and "stopped at" in html and "NVIDIA H200" in html
    assert "GPU0 NVIDIA H200" in data["text/plain"]
    assert nb.cells[1].outputs[0].data["text/plain"] == "True"
    assert "stopped 1 monitor(s)" in nb.cells[2].outputs[0].text
    assert _exported(nb).count('class="gpunb-chart"') == 9


def test_a_live_monitor_saved_mid_run_keeps_a_recent_frame(monkeypatch, tmp_path):
    nb = _execute(
        [
            "%load_ext gpunb\n%gpumonitor --hz 4",
            "import time\ntime.sleep(2.5)\nprint(time.strftime('%H:%M:%S'))",
        ],
        monkeypatch,
        tmp_path,
    )
    *controls, frame = nb.cells[0].outputs
    data = frame.data
    assert WIDGET_VIEW not in data  # the frame needs no widget model after reopening
    # the controls, still live at the end of the run, are a widget that nbclient saved with its
    # state in the notebook's metadata (so they reopen as buttons, not "model not found")
    assert len(controls) == HAS_WIDGETS
    for c in controls:
        model_id = c.data[WIDGET_VIEW]["model_id"]
        assert model_id in nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    html = data["text/html"]
    assert len(images(html, "gpunb-chart")) == 9 and "last sample" in html
    # Redrawn in place while the next cell ran: the saved frame is from its end, not its start.
    shown = re.search(r"last sample \d{4}-\d\d-\d\d (\d\d:\d\d:\d\d)", html).group(1)
    ended = nb.cells[1].outputs[0].text.strip()
    to_s = lambda hms: sum(int(x) * f for x, f in zip(hms.split(":"), (3600, 60, 1)))  # noqa: E731
    assert 0 <= to_s(ended) - to_s(shown) <= 1, (shown, ended)
    assert _exported(nb).count('class="gpunb-chart"') == 9
