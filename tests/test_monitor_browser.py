"""A real browser: JupyterLab started here, Debian's Chromium driven by Playwright.

Proves that ``%gpumonitor`` renders its inline SVG through the core widget manager and
that the sampler thread keeps redrawing it while another cell (a ``time.sleep`` loop)
is running. The kernel reads the fake NVML replaying the recorded H200 trace
(``GPUNB_FAKE_NVML=h200`` in the server's environment, inherited by the kernel).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
SLEEP_CELL_S = 14


def _missing() -> str:
    if not os.path.exists(CHROMIUM):
        return f"Debian's Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python Playwright is not installed (pip install playwright; no browser download needed)"
    beside_python = shutil.which("jupyter-lab", path=os.path.dirname(sys.executable))
    if beside_python is None and shutil.which("jupyter-lab") is None:
        return "JupyterLab is not installed (pip install jupyterlab)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(path: Path) -> None:
    cells = [
        "%load_ext gpunb\n%gpumonitor --hz 4 --window 20",
        f"import time\nfor _ in range({SLEEP_CELL_S * 4}):\n    time.sleep(0.25)\nprint('sleep done')",
    ]
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


@pytest.fixture
def lab(tmp_path):
    why = _missing()
    if why:
        pytest.skip(why)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        GPUNB_FAKE_NVML="h200",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        # Fresh config and runtime (no user settings, no stale workspace); the data dir
        # stays, because the widget manager's lab extension is found there.
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    root = tmp_path / "root"
    root.mkdir()
    _notebook(root / "monitor.ipynb")
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 (the server writes to it until teardown)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--allow-root", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("jupyter lab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield base, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _results_dir() -> Path:
    path = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_monitor_renders_and_keeps_drawing_while_a_cell_runs(lab):
    from playwright.sync_api import sync_playwright

    base, token, _ = lab
    out = _results_dir()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{base}/lab/tree/monitor.ipynb?token={token}")
            # Running cells before the kernel is ready runs nothing: wait for Idle.
            page.wait_for_selector("text=| Idle", timeout=45_000)
            page.locator(".jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")  # cell 1: load gpunb, show the monitor
            chart = ".jp-OutputArea-output .widget-html-content .gpunb-monitor svg.gpunb-spark"
            page.wait_for_selector(chart, timeout=30_000)
            page.wait_for_selector("text=| Idle", timeout=20_000)
            page.keyboard.press("Shift+Enter")  # cell 2: the sleep loop, standing in for training
            page.wait_for_selector(".jp-Cell:nth-child(2) .jp-InputPrompt:has-text('[*]')", timeout=10_000)

            widget = page.locator(".widget-html-content .gpunb-monitor").first
            svgs_before = widget.locator("svg.gpunb-spark").evaluate_all("els => els.map(e => e.outerHTML)")
            page.screenshot(path=str(out / "monitor-browser-1.png"))
            time.sleep(2.5)
            svgs_after = widget.locator("svg.gpunb-spark").evaluate_all("els => els.map(e => e.outerHTML)")
            page.screenshot(path=str(out / "monitor-browser-2.png"))
            still_running = page.locator(".jp-Cell:nth-child(2) .jp-InputPrompt").inner_text()
            caption = widget.inner_text()
        finally:
            browser.close()

    assert len(svgs_before) == 7  # memory, util, power, temperature, SM clock; host CPU, RAM
    assert all("<path" in svg for svg in svgs_after)  # every chart has drawn points
    assert "NVIDIA H200" in caption and "live at 4 Hz" in caption
    # Redrawn from the sampler thread while the sleep cell still runs.
    assert "[*]" in still_running, "the sleep cell finished before the second look; the test proves nothing"
    changed = sum(a != b for a, b in zip(svgs_before, svgs_after))
    assert changed >= 5, f"only {changed} of {len(svgs_before)} charts changed in 2.5 s"
    (out / "monitor-browser.json").write_text(
        json.dumps({"charts": len(svgs_before), "changed_in_2_5_s": changed}, indent=1)
    )
