"""Regenerate the screenshots of README.md and docs/gallery.md: every gpunb view in JupyterLab 4, light and dark.

A notebook of every view (``tests/output_notebook.py``) is run by nbclient in a kernel that
reads the fake NVML (``two-gpus``: readings recorded on an H200, replayed for two GPUs) and
trains with CPU torch; the monitor watches half a minute of the replay. ``%gpufit`` shows
a result recorded on the H200 (the batch-fit zoo's transformer) and the OOM doctor the
message recorded there. The notebook
is opened in JupyterLab in Debian's Chromium and each output is cropped to
``docs/screenshots/<view>-<theme>.png`` (kept under 200 KB); a second notebook shows the
monitor of the ``eight-gpus`` fake (``monitor-8gpus-light.png``).

    python scripts/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.jupyter_browser import JupyterServer, chromium, missing  # noqa: E402
from tests.output_notebook import CELLS  # noqa: E402

MAX_BYTES = 200_000
# view -> the element inside an output that holds it
VIEWS = {
    "check": ".gpunb-check",
    "monitor": ".gpunb-monitor",
    "profile": ".gpunb-profile",
    "history": ".gpunb-history",
    "memory": ".gpunb-memory",
    "fit": "img.gpunb-chart[src^='data:image/png']",
    "oom": ":text('gpunb OOM doctor')",
    "trace": ".gpunb-trace",
    "leak": ".gpunb-profile:has-text('memory grows')",
    "energy": ".gpunb-energy:has-text('since %load_ext')",
}


def screenshot_cells() -> list[tuple[str, str, tuple[str, ...]]]:
    """The test notebook's cells, with the monitor on a 30 s window that sees the replay's
    training phase (a cell waits before the monitor is stopped)."""
    cells = []
    for name, source, tags in CELLS:
        if name == "monitor":
            source = "%gpumonitor --hz 2 --window 30"
        if name == "stop":
            cells.append(("wait", "import time\ntime.sleep(24)  # let the monitor see the replayed training", ()))
        cells.append((name, source, tags))
    return cells


EIGHT_GPU_CELLS = [
    ("load", "%load_ext gpunb", ()),
    ("monitor", "%gpumonitor --hz 2 --window 30", ()),
    ("wait", "import time\ntime.sleep(24)  # let the monitor see the replayed training", ()),
    ("stop", "%gpumonitor --stop", ()),
]


def _small_png(data: bytes) -> bytes:
    """The PNG as is, or with a 256-colour palette when it is over the size limit."""
    if len(data) <= MAX_BYTES:
        return data
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"screenshots: cannot run: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from tests.output_notebook import build_and_run

    with tempfile.TemporaryDirectory() as tmp:
        server = JupyterServer(Path(tmp), scenario="two-gpus")
        try:
            server.api("PUT", "/lab/api/settings/@jupyterlab/notebook-extension:tracker",
                       {"raw": json.dumps({"windowingMode": "none"})})
            notebook = build_and_run(server.root / "gpunb-views.ipynb", cells=screenshot_cells())
            eight = build_and_run(server.root / "gpunb-8gpus.ipynb", scenario="eight-gpus", cells=EIGHT_GPU_CELLS)
            shots = [(notebook, theme, VIEWS, "") for theme in ("light", "dark")]
            shots.append((eight, "light", {"monitor": VIEWS["monitor"]}, "-8gpus"))
            with chromium() as browser:
                for nb, theme, views, suffix in shots:
                    server.set_theme(theme)
                    page = browser.new_page(viewport={"width": 1100, "height": 6000})
                    page.goto(server.lab_url(nb.name))
                    page.wait_for_selector(".jp-OutputArea-output img.gpunb-chart", timeout=60_000)
                    page.locator(".jp-Notebook").first.click()
                    page.keyboard.press("Escape")
                    page.keyboard.press("Control+b")  # close the file browser: a notebook's usual width
                    page.wait_for_timeout(1500)
                    for view, inner in views.items():
                        output = page.locator(".jp-OutputArea-output", has=page.locator(inner)).first
                        path = out / f"{view}{suffix}-{theme}.png"
                        path.write_bytes(_small_png(output.screenshot()))
                        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path  # --out may be elsewhere
                        print(f"{shown}  {path.stat().st_size // 1024} KB")
                    page.close()
        finally:
            server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
