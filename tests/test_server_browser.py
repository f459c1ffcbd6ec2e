"""A real browser: JupyterLab with gpunb's server extension enabled by the shipped config
file, Debian's Chromium driven by Playwright. A notebook's ``%gpumonitor`` names the
notebooks whose kernels hold the (fake) GPU's memory, and shows hostile notebook names as
text.

The server and every kernel read the fake NVML replaying the recorded H200; its process
list is a file this test writes with the PIDs of real kernels, and those kernels hold files
standing in for the NVIDIA device files (``GPUNB_FAKE_NVIDIA_DEVICES``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.jupyter_browser import CHROMIUM, _free_port
from tests.jupyter_browser import missing as _missing
from tests.jupyter_browser import results_dir as _results_dir

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
HOSTILE = 'x<img src=x onerror="document.title=1">.ipynb'
HOLD_DEVICES = ("import os\n_gpunb_fake_devices = [open(os.path.join(os.environ['GPUNB_FAKE_NVIDIA_DEVICES'], n)) "
                "for n in ('nvidiactl', 'nvidia0', 'nvidia-uvm')]\nprint(os.getpid())")


def _notebook(path: Path) -> None:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "c0", "metadata": {}, "outputs": [],
                   "source": "%load_ext gpunb\n%gpumonitor --hz 4 --window 20"}],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


class Lab:
    def __init__(self, base: str, token: str, runtime: Path, processes: Path) -> None:
        self.base, self.token, self.runtime, self.processes = base, token, runtime, processes
        self.rows: list[dict] = []

    def api(self, path: str, body: dict | None = None) -> object:
        request = urllib.request.Request(f"{self.base}/{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def run(self, kernel_id: str, code: str) -> str:
        """Run code in a kernel through its connection file; its printed output."""
        from jupyter_client import BlockingKernelClient

        kc = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels()
        out: list[str] = []
        try:
            kc.wait_for_ready(timeout=60)
            kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(
                m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        finally:
            kc.stop_channels()
        return "".join(out)

    def hold(self, kernel_id: str, nbytes: int) -> int:
        """The kernel opens the fake device files and the fake GPU lists its PID."""
        pid = int(self.run(kernel_id, HOLD_DEVICES))
        self.rows.append({"gpu": 0, "pid": pid, "used_gpu_memory": nbytes, "name": "python"})
        tmp = self.processes.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rows))
        tmp.replace(self.processes)
        return pid


@pytest.fixture
def lab(tmp_path):
    why = _missing()
    if why:
        pytest.skip(why)
    port, token = _free_port(), secrets.token_hex(16)
    config, runtime, devices = tmp_path / "config", tmp_path / "runtime", tmp_path / "dev"
    (config / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(ROOT / "jupyter-config/jupyter_server_config.d/gpunb.json", config / "jupyter_server_config.d")
    devices.mkdir()
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        (devices / name).write_bytes(b"")
    processes = tmp_path / "gpu-processes.json"
    env = dict(os.environ)
    env.update(
        GPUNB_FAKE_NVML="h200",
        GPUNB_FAKE_NVML_PROCESSES=str(processes),
        GPUNB_FAKE_NVIDIA_DEVICES=str(devices),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        JUPYTER_CONFIG_DIR=str(config),  # only the shipped gpunb.json enables the extension
        JUPYTER_RUNTIME_DIR=str(runtime),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    root = tmp_path / "root"
    (root / "course").mkdir(parents=True)
    _notebook(root / "monitor.ipynb")
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 (the server writes to it until teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        while True:
            try:
                urllib.request.urlopen(f"{base}/gpunb/api/gpus?token={token}", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("jupyter lab (with gpunb's extension) did not start:\n"
                                + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield Lab(base, token, runtime, processes)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_notebooks_monitor_names_the_notebooks_that_hold_the_gpu(lab):
    from playwright.sync_api import sync_playwright

    out = _results_dir()
    session = lambda path: lab.api("api/sessions", {  # noqa: E731
        "path": path, "name": os.path.basename(path), "type": "notebook", "kernel": {"name": "python3"}})
    lab.hold(session("course/lesson3.ipynb")["kernel"]["id"], 31 * GiB)
    lab.hold(session(HOSTILE)["kernel"]["id"], 1 * GiB)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{lab.base}/lab/tree/monitor.ipynb?token={lab.token}")
            page.wait_for_selector("text=| Idle", timeout=45_000)
            page.locator(".jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            holders = page.locator(".jp-OutputArea-output .gpunb-monitor .gpunb-holders").first
            holders.wait_for(timeout=30_000)
            page.wait_for_selector(".gpunb-holders >> text=course/lesson3.ipynb held GPU 0 idle", timeout=30_000)
            # This notebook's own kernel takes memory too: the monitor names it once the server says so.
            mine = next(s for s in lab.api("api/sessions") if s["path"] == "monitor.ipynb")["kernel"]["id"]
            page.wait_for_selector("text=| Idle", timeout=20_000)
            lab.hold(mine, 2 * GiB)
            page.wait_for_selector(".gpunb-holders >> text=this notebook holds 2.0 GiB", timeout=40_000)
            text = holders.inner_text()
            injected = holders.locator("img").count()
            title = page.title()
            page.screenshot(path=str(out / "server-monitor-browser.png"))
        finally:
            browser.close()

    assert "course/lesson3.ipynb held GPU 0 idle" in text and "holds 31.0 GiB" in text
    assert "this notebook holds 2.0 GiB" in text
    assert HOSTILE in text and injected == 0 and title != "1"  # shown as text, never as markup
    (out / "server-monitor-browser.json").write_text(json.dumps({"holders": text}, indent=1))
