"""Every gpunb output as people open it: a real JupyterLab 4 and Notebook 7 in Debian's
Chromium (Playwright, no browser download), and nbconvert's HTML.

- a notebook run by nbclient (as CI, a colleague or a workshop handout makes one) opened
  *untrusted* in JupyterLab, light and dark, and in Notebook 7: every chart is an image the
  browser decoded and laid out (``naturalWidth > 0``, a box of non-zero size), the inline
  ``<svg>`` the sanitizer strips is not what carries them;
- the live monitor redrawn while another cell runs, saved, the kernel gone, the notebook
  reopened: the last frame is there, nothing says "model not found";
- the notebook exported by nbconvert, light and dark.

One JupyterLab server for the module; it reads the fake NVML (real H200 readings).
"""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest

from tests.jupyter_browser import (
    JupyterServer,
    chromium,
    missing,
    notebook_json,
    output_images,
    output_text,
    results_dir,
    visible_images,
    wait_idle,
)
from tests.output_notebook import INDEX, PROBE_SVG, build_and_run

pytestmark = pytest.mark.browser

# Charts the notebook's outputs hold with the two-GPU fake: the monitor (one panel per reading
# with a line per GPU: 5, the host's 2, PCIe in and out; each GPU's own 5 in a closed <details>),
# the profile's memory timeline, one memory bar (the fake's two GPUs hold the same, so one
# bar says it for both), the %gpufit curve, the memory trace's timeline by role.
LIVE_MONITOR = 5 + 2 + 2  # the live frame draws each GPU's panels only when asked (Each GPU)
EXPECTED = {"monitor": LIVE_MONITOR + 5 * 2, "profile": 1, "memory": 1, "fit": 1, "trace": 1, "leak": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("jupyter")
    srv = JupyterServer(tmp, scenario="two-gpus")
    # Render every cell (no windowing): a test measures what a scrolling user would see.
    srv.api("PUT", "/lab/api/settings/@jupyterlab/notebook-extension:tracker",
            {"raw": json.dumps({"windowingMode": "none"})})
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def views_notebook(server):
    """The notebook of every view, run by nbclient and written unsigned into the server's root."""
    return build_and_run(server.root / "views.ipynb")


@pytest.fixture(scope="module")
def browser():
    if missing():
        pytest.skip(missing())
    with chromium() as b:
        yield b


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 5000})
    page.goto(url)
    page.wait_for_selector(".jp-OutputArea-output img.gpunb-chart", timeout=60_000)
    page.wait_for_timeout(800)  # images decode after the HTML is in the page
    return page


def _cell_images(page, name: str) -> tuple[list[dict], list[dict]]:
    """(all, visible) images in the output of the notebook cell called ``name``."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(INDEX[name])
    cell.scroll_into_view_if_needed()
    found = cell.evaluate("""c => Array.from(c.querySelectorAll('.jp-OutputArea-output img')).map(img => {
        const box = img.getBoundingClientRect();
        return {cls: img.className, natural: img.naturalWidth, complete: img.complete,
                width: box.width, height: box.height};
    })""")
    return found, [i for i in found if i["complete"] and i["natural"] > 0 and i["width"] > 0 and i["height"] > 0]


def _clock_s(caption: str) -> int:
    h, m, sec = re.search(r"(\d\d):(\d\d):(\d\d)", caption).groups()
    return int(h) * 3600 + int(m) * 60 + int(sec)


def _luminance(css_color: str) -> float:
    parts = [float(x) for x in css_color[css_color.index("(") + 1 : css_color.index(")")].split(",")[:3]]
    return (0.2126 * parts[0] + 0.7152 * parts[1] + 0.0722 * parts[2]) / 255


def _check_every_view(page, shot: Path) -> None:
    page.screenshot(path=str(shot), full_page=True)
    for name, want in EXPECTED.items():
        found, shown = _cell_images(page, name)
        charts = [i for i in shown if "gpunb-chart" in i["cls"]]
        assert len(charts) == want, (name, found)
        assert len(shown) == len(found), (name, found)  # every image of it decoded and laid out
    text = output_text(page)
    assert "model not found" not in text and "Error displaying" not in text
    # the conclusions, first in their outputs
    assert "is a CPU-only build: every model trains on the CPU" in text
    assert "stopped at" in text and "gpuprofile In [" in text and "MLP, batch 128" in text
    assert "gpuprofile history: 2 cells" in text and "one-line" in text


def test_untrusted_notebook_shows_every_chart_in_jupyterlab(server, views_notebook, browser):
    server.set_theme("light")
    page = _open(browser, server.lab_url(views_notebook.name))
    try:
        # The notebook is untrusted: the sanitizer removed the probe's inline <svg>...
        assert page.locator(f"svg.{PROBE_SVG}").count() == 0
        _check_every_view(page, results_dir() / "untrusted-lab-light.png")  # ...and no gpunb chart needed it
    finally:
        page.close()


def test_dark_theme_keeps_every_chart_and_words_take_the_theme_colour(server, views_notebook, browser):
    server.set_theme("dark")
    page = _open(browser, server.lab_url(views_notebook.name))
    try:
        background = page.locator(".jp-Notebook").evaluate("n => getComputedStyle(n).backgroundColor")
        assert _luminance(background) < 0.2, background  # the dark theme is on
        caption = page.locator(".gpunb-caption").first.evaluate("n => getComputedStyle(n).color")
        assert _luminance(caption) > 0.6, caption  # gpunb's words are light on dark, not a fixed grey
        _check_every_view(page, results_dir() / "untrusted-lab-dark.png")
    finally:
        page.close()
        server.set_theme("light")


def test_notebook7_shows_every_chart(server, views_notebook, browser):
    try:
        import notebook  # noqa: F401
    except ImportError:
        pytest.skip("Notebook 7 is not installed (pip install notebook)")
    page = _open(browser, server.notebook7_url(views_notebook.name))
    try:
        assert page.locator(f"svg.{PROBE_SVG}").count() == 0  # untrusted here too
        _check_every_view(page, results_dir() / "untrusted-notebook7.png")
    finally:
        page.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_nbconvert_html_shows_every_chart(views_notebook, browser, tmp_path, theme):
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(theme=theme).from_filename(str(views_notebook))
    page_path = tmp_path / f"views-{theme}.html"
    page_path.write_text(body)
    page = browser.new_page(viewport={"width": 1400, "height": 5000})
    try:
        page.goto(f"file://{page_path}")
        page.wait_for_timeout(800)
        page.screenshot(path=str(results_dir() / f"nbconvert-{theme}.png"), full_page=True)
        shown = page.locator("body").evaluate("""b => Array.from(b.querySelectorAll('img.gpunb-chart')).filter(img => {
            const box = img.getBoundingClientRect();
            return img.complete && img.naturalWidth > 0 && box.width > 0 && box.height > 0;
        }).length""")
        assert shown == sum(EXPECTED.values())
    finally:
        page.close()


def test_live_monitor_redraws_then_survives_save_and_reopen(server, browser):
    name = "live.ipynb"
    server.write_notebook(name, notebook_json([
        "%load_ext gpunb\n%gpumonitor --hz 4 --window 20",
        "import time\nfor _ in range(40):\n    time.sleep(0.25)\nprint('sleep done')",
    ]))
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    out = results_dir()
    try:
        page.goto(server.lab_url(name))
        wait_idle(page)
        page.locator(".jp-Cell").first.click()
        page.keyboard.press("Shift+Enter")  # the monitor
        page.wait_for_selector(".gpunb-monitor img.gpunb-chart", timeout=30_000)
        wait_idle(page, 20_000)
        page.keyboard.press("Shift+Enter")  # the sleep loop, standing in for training
        sleep_prompt = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt")
        sleep_prompt.filter(has_text="[*]").wait_for(timeout=10_000)
        time.sleep(1.0)
        monitor = page.locator(".gpunb-monitor").first
        before = monitor.locator("img.gpunb-chart").evaluate_all("els => els.map(e => e.src)")
        time.sleep(2.5)
        after = monitor.locator("img.gpunb-chart").evaluate_all("els => els.map(e => e.src)")
        running = sleep_prompt.inner_text()
        page.screenshot(path=str(out / "monitor-live.png"))
        assert "[*]" in running, "the sleep cell finished before the second look; the test proves nothing"
        assert len(before) == len(after) == LIVE_MONITOR
        changed = sum(a != b for a, b in zip(before, after))
        assert changed >= 5, f"only {changed} of {len(before)} charts were redrawn in 2.5 s"
        assert len(visible_images(page)) >= LIVE_MONITOR

        # Save while it is live, then the kernel goes away and the notebook is opened again.
        at_save = monitor.locator(".gpunb-caption").inner_text()
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1500)
        saved = json.loads((server.root / name).read_text())
        saved_outputs = saved["cells"][0]["outputs"]
        assert all("application/vnd.jupyter.widget-view+json" not in o.get("data", {}) for o in saved_outputs)
        saved_html = "".join(saved_outputs[0]["data"]["text/html"])  # a saved notebook may split it in lines
        saved_caption = re.search(r'class="gpunb-caption"[^>]*>([^<]*)<', saved_html).group(1)
        saved_caption = html.unescape(saved_caption)
        # the saved frame is the one on screen when the user saved (a second later at most)
        assert _clock_s(saved_caption) - _clock_s(at_save) in (0, 1), (at_save, saved_caption)
        page.close()
        server.shutdown_kernels()

        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(server.lab_url(name))
        page.wait_for_selector(".gpunb-monitor img.gpunb-chart", timeout=60_000)
        page.wait_for_timeout(800)
        page.screenshot(path=str(out / "monitor-reopened.png"))
        text = output_text(page)
        assert "model not found" not in text and "Error displaying" not in text
        assert page.locator(".gpunb-caption").first.inner_text() == saved_caption  # the frame saved last
        charts = [i for i in visible_images(page) if "gpunb-chart" in i["cls"]]
        # the frame saved while live: the overview, without each GPU's panels
        assert len(charts) == LIVE_MONITOR and len(output_images(page)) == len(visible_images(page))
    finally:
        page.close()
