"""How much screen each gpunb output takes in JupyterLab, measured in Chromium.

The notebook of every view (``tests/output_notebook.py``) is run by nbclient against the fake
NVML with two and with eight H200s, then opened in JupyterLab at 1366×768. Each output's
height is measured against the notebook's visible area (one "screen"): every default view
fits one screen at 2 GPUs and stays under 1.5 screens at 8. At 1024×768 with the file
browser open, no output is wider than the room it has (it wraps, or scales, or scrolls; it is
never cut). The numbers go to ``$GPUNB_RESULTS/output-heights.json`` and a Markdown table
(``output-heights.md``) that ``docs/outputs.md`` keeps.

The monitor (its stopped frame: each GPU's panels in a closed ``<details>``) must fit one screen
at 2 and at 8 GPUs: before its overview it took 1.4 and 4.1 screens.
"""

from __future__ import annotations

import json

import pytest

from tests.jupyter_browser import JupyterServer, chromium, missing, results_dir
from tests.output_notebook import INDEX, build_and_run

pytestmark = pytest.mark.browser

# The views judged here, and which of a cell's outputs is the view (-1: the last; the OOM
# cell's traceback comes first and is IPython's own).
VIEWS = {"check": -1, "profile": 0, "history": -1, "memory": -1, "fit": -1, "oom": -1,
         "trace": 0, "oom-sites": -1, "leak": 0, "energy": -1}
MEASURED = [*VIEWS, "monitor"]
LIMIT_SCREENS = {"two-gpus": 1.0, "eight-gpus": 1.5}
MONITOR_LIMIT_SCREENS = 1.0  # at 2 and at 8 GPUs: one panel per reading, a line per GPU


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("heights")
    srv = JupyterServer(tmp, scenario="two-gpus")
    srv.api("PUT", "/lab/api/settings/@jupyterlab/notebook-extension:tracker",
            {"raw": json.dumps({"windowingMode": "none"})})
    notebooks = {s: build_and_run(srv.root / f"views-{s}.ipynb", scenario=s) for s in LIMIT_SCREENS}
    with chromium() as browser:
        yield srv, notebooks, browser
    srv.close()


def _open(browser, url: str, width: int, height: int):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.wait_for_selector(".jp-OutputArea-output .gpunb-check", timeout=60_000)
    page.wait_for_timeout(1000)  # images decode and lay out after the HTML is in the page
    return page


def _heights(page) -> tuple[int, dict[str, int]]:
    """(the notebook's visible height, px of each measured view)."""
    screen = page.locator(".jp-NotebookPanel-notebook").first.evaluate("n => n.clientHeight")
    out = {}
    for name in MEASURED:
        which = VIEWS.get(name, -1)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(INDEX[name])
        out[name] = cell.evaluate(f"""c => {{
            const kids = Array.from(c.querySelectorAll('.jp-OutputArea-child'));
            const kid = kids.at({which});
            return kid ? Math.round(kid.getBoundingClientRect().height) : 0;
        }}""")
    return screen, out


def test_every_view_fits_its_screen_budget(setup):
    srv, notebooks, browser = setup
    table = {}
    for scenario, path in notebooks.items():
        page = _open(browser, srv.lab_url(path.name), 1366, 768)
        try:
            screen, heights = _heights(page)
            # the notebook is untrusted (nbclient does not sign it): the sanitizer kept <details>
            assert page.locator(".jp-OutputArea-output .gpunb-check details").count() >= 5
            assert page.locator(".jp-OutputArea-output .gpunb-oom details").count() == 2  # without, with sites
            assert page.locator(".jp-OutputArea-output .gpunb-trace details").count() == 1
            assert page.locator(".jp-OutputArea-output .gpunb-trace img.gpunb-chart").count() == 1
            # the trace's verdict is above what the traced cell printed
            order = page.locator(".jp-Notebook .jp-Cell").nth(INDEX["trace"]).evaluate("""c => Array.from(
                c.querySelectorAll('.jp-OutputArea-child')).map(k => k.querySelector('.gpunb-trace') ? 'trace'
                : k.textContent.includes('step 2: loss') ? 'printed' : 'other')""")
            assert order == ["trace", "printed"], order
        finally:
            page.close()
        table[scenario] = {"screen_px": screen, "heights_px": heights}
    out = results_dir()
    (out / "output-heights.json").write_text(json.dumps(table, indent=2))
    rows = ["| output | 2 GPUs | 8 GPUs |", "|---|---|---|"]
    for name in MEASURED:
        cells = [f"{table[s]['heights_px'][name]} px = {table[s]['heights_px'][name] / table[s]['screen_px']:.2f} "
                 "screens" for s in LIMIT_SCREENS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "output-heights.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    for scenario, limit in LIMIT_SCREENS.items():
        screen = table[scenario]["screen_px"]
        assert screen > 400, table  # the notebook area of a 1366×768 window
        for name in VIEWS:
            px = table[scenario]["heights_px"][name]
            assert 0 < px <= limit * screen, (scenario, name, px, screen)
        px = table[scenario]["heights_px"]["monitor"]
        assert 0 < px <= MONITOR_LIMIT_SCREENS * screen, (scenario, "monitor", px, screen)


def test_nothing_is_cut_at_1024_px_with_the_file_browser_open(setup):
    srv, notebooks, browser = setup
    page = _open(browser, srv.lab_url(notebooks["eight-gpus"].name), 1024, 768)
    try:
        if not page.locator(".jp-FileBrowser").first.is_visible():
            page.keyboard.press("Control+Shift+F")  # JupyterLab's shortcut for the file browser
            page.wait_for_timeout(500)
        assert page.locator(".jp-FileBrowser").first.is_visible()
        page.screenshot(path=str(results_dir() / "outputs-1024-filebrowser.png"), full_page=True)
        # A view's root is wider than its output area only where its content cannot wrap;
        # such content must scroll (overflow auto/scroll), never be hidden.
        cut = page.evaluate("""() => {
            const found = [];
            for (const out of document.querySelectorAll('.jp-OutputArea-output')) {
                const root = out.querySelector('[class^="gpunb-"]');
                if (!root || root.className.startsWith('gpunb-monitor')) continue;
                const wide = root.scrollWidth > out.clientWidth + 1;
                const scrolls = ['auto', 'scroll'].includes(getComputedStyle(out).overflowX);
                if (wide && !scrolls) found.push(root.className + ' ' + root.scrollWidth + '>' + out.clientWidth);
            }
            return found;
        }""")
        assert cut == []
    finally:
        page.close()
