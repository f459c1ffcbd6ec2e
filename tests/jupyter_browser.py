"""A Jupyter server and Debian's Chromium for the real-browser tests (no browser download).

``JupyterServer`` runs ``jupyter lab`` in a subprocess (as root it needs ``--allow-root``)
with a fresh config, runtime and IPython directory, and the fake NVML replaying the
recorded H200 trace in the kernel's environment. The same server also serves Notebook 7
(``/notebooks/...``) when the ``notebook`` package is installed. ``chromium()`` launches
``/usr/bin/chromium`` through Playwright with the flags a CI container needs.

Helpers read what a user sees: ``visible_images`` measures every chart image in the page
(its rendered box and whether the browser decoded it), never just its HTML.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


def results_dir() -> Path:
    """Where tests leave screenshots and figures: $GPUNB_RESULTS, else a fresh temp dir."""
    path = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def missing() -> str:
    """Why the browser tests cannot run here ('' when they can)."""
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


def notebook_json(cells: list[str]) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def kernel_env(tmp: Path, scenario: str = "h200") -> dict:
    env = dict(os.environ)
    env.update(
        GPUNB_FAKE_NVML=scenario,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        # Fresh config and runtime (no user settings, no stale workspace); the data dir
        # stays, because the lab extensions are found there.
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        IPYTHONDIR=str(tmp / "ipython"),
    )
    return env


class JupyterServer:
    def __init__(self, tmp: Path, scenario: str = "h200") -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = kernel_env(tmp, scenario)
        self._log_path = tmp / "server.log"
        self._log = open(self._log_path, "w")  # noqa: SIM115 (the server writes to it until close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             "--allow-root", "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.api("GET", "/api/status")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self._log.flush()
                    self.close()
                    pytest.fail("jupyter lab did not start:\n" + self._log_path.read_text()[-3000:])
                time.sleep(0.3)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read()
        return json.loads(text) if text else None

    def set_theme(self, theme: str) -> None:
        """The theme JupyterLab and Notebook 7 load next (a user setting, like the menu's)."""
        raw = json.dumps({"theme": THEMES[theme]})
        self.api("PUT", "/lab/api/settings/@jupyterlab/apputils-extension:themes", {"raw": raw})

    def write_notebook(self, name: str, nb: dict) -> Path:
        path = self.root / name
        path.write_text(json.dumps(nb))
        return path

    def lab_url(self, name: str) -> str:
        # ?reset: a fresh workspace, so only this notebook is open (not the tabs of earlier pages)
        return f"{self.base}/lab/tree/{name}?reset&token={self.token}"

    def notebook7_url(self, name: str) -> str:
        return f"{self.base}/notebooks/{name}?token={self.token}"

    def shutdown_kernels(self) -> None:
        for kernel in self.api("GET", "/api/kernels") or []:
            self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_idle(page: Any, timeout_ms: int = 60_000) -> None:
    """Wait until the kernel is idle (running cells before it is ready runs nothing)."""
    page.wait_for_selector("text=| Idle", timeout=timeout_ms)


def run_all_cells(page: Any, count: int) -> None:
    """Shift+Enter through ``count`` cells, from the first."""
    page.locator(".jp-Cell").first.click()
    for _ in range(count):
        page.keyboard.press("Shift+Enter")


# Every image inside outputs, as the browser rendered it.
_IMAGES_JS = """root => Array.from(root.querySelectorAll('.jp-OutputArea-output img')).map(img => {
  const box = img.getBoundingClientRect();
  return {cls: img.className, alt: img.alt, complete: img.complete, natural: img.naturalWidth,
          width: box.width, height: box.height, src_kind: img.src.slice(0, 26)};
})"""


def output_images(page: Any) -> list[dict]:
    return page.locator("body").evaluate(_IMAGES_JS)


def visible_images(page: Any) -> list[dict]:
    """Images that are drawn: decoded by the browser and given a box on the page."""
    return [i for i in output_images(page) if i["complete"] and i["natural"] > 0 and i["width"] > 0 and i["height"] > 0]


def output_text(page: Any) -> str:
    return "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
