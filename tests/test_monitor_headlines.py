"""Every headline number is what its chart shows, at 1, 2 and 8 GPUs, over the whole recording.

The class closed: a chart's large number aggregated differently from the lines under it (a sum
over GPUs above per-GPU lines: "17.7 GiB · max 8.8", "114 GB/s" on an 80 GB/s axis) and charts
that state series they do not draw (eight GPUs' PCIe, read in turns, drew no line). For frames
taken every few seconds while the fake NVML replays the recorded H200 (``h200``, ``two-gpus``,
``eight-gpus``), each panel's large number and its "max" are recomputed from the sampler's own
record (the ``Window`` the frame was drawn from) with the aggregate the panel names, and checked
against what the panel says: same value, the unit of its title, on its axis, every series with a
reading drawn as a line.
"""

from __future__ import annotations

import html
import re
import statistics

import pytest

from gpunb.analysis.monitor.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.views.monitor_layout import monitor_html
from gpunb.views.sparkline import SEEN_FOR_S
from tests.chart_html import SVG, images, svg_of

WINDOW_S = 30.0
# What a title ends with for each aggregate (a chart of several lines names its number's aggregate).
TITLE_WORDS = {"max": ("fullest GPU", "highest GPU", "hottest GPU", "busiest GPU"), "mean": ("mean of GPUs",),
               "min": ("slowest GPU",)}
COMBINE = {"max": max, "mean": statistics.fmean, "min": min}
_PANEL = re.compile(r'<div class="gpunb-panel" style="[^"]*" data-series="([^"]*)" '
                    r'data-aggregate="([^"]*)" data-scale="([^"]*)"')
_NUMBER = re.compile(r"-?[\d,]+(?:\.\d+)?")


def frames(name: str, until_s: float = 70.0, every_s: float = 3.5):
    """(window, html) every ``every_s`` seconds of the replayed recording, 2 Hz sampling."""
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731
    sampler = Sampler(NvmlSession(scenario(name, clock=clock)), clock=clock, own_pids=[load_trace()["pid"]],
                      process_refresh_s=0)
    next_frame = every_s
    while t[0] <= until_s:
        sampler.tick()
        if t[0] >= next_frame:
            next_frame += every_s
            window = sampler.window(WINDOW_S)
            yield window, monitor_html(window, state="stopped")
        t[0] += 0.5


def column(window, key: str) -> list:
    m = re.fullmatch(r"gpu(\d+)_(\w+)", key)
    if m is None:
        return window.host[key]
    [g] = [g for g in window.gpus if g.index == int(m.group(1))]
    return g.columns[m.group(2)]


def panels(page: str) -> list[dict]:
    """Each panel's declared series and aggregate, title, large number, max, axis top and lines."""
    out = []
    starts = [m for m in _PANEL.finditer(page)]
    for m, nxt in zip(starts, [*starts[1:], None], strict=True):
        chunk = page[m.start(): nxt.start() if nxt else len(page)]
        title = html.unescape(re.search(r'<b style="font-weight:600">(.*?)</b>', chunk).group(1))
        big = html.unescape(re.search(r'<b style="font-size:15px">(.*?)</b>', chunk).group(1))
        peak = html.unescape(re.search(r'<b style="font-size:15px">.*?</b><span[^>]*>(.*?)</span>', chunk).group(1))
        charts = images(chunk, "gpunb-chart")
        axis = re.search(r"height:\d+px;width:\d+px;[^>]*><span>([^<]*)</span><span>0</span>", chunk)
        lines = []
        if charts:
            for path in svg_of(charts[0]).iter(SVG + "path"):
                if path.get("stroke-width") == "1.5":  # a series' line (frame and limit lines are thinner)
                    lines.append(path.get("d"))
        out.append({"keys": m.group(1).split(), "aggregate": m.group(2), "scale": float(m.group(3)),
                    "title": title, "big": big, "peak": peak, "axis": float(axis.group(1)) if axis else None,
                    "lines": lines, "bars": bool(charts) and 'V' in (lines[0] if lines else "V")})
    return out


def shown(text: str) -> tuple[float | None, int]:
    """The number in a panel's text and its decimals; None for "n/a" or nothing."""
    m = _NUMBER.search(text)
    if m is None:
        return None, 0
    digits = len(m.group(0).split(".")[1]) if "." in m.group(0) else 0
    return float(m.group(0).replace(",", "")), digits


def expected(window, panel: dict) -> tuple[float | None, float | None]:
    """(now, window max) of the panel's aggregate, recomputed from the record."""
    t = window.t_s
    cols = [column(window, k) for k in panel["keys"]]
    scale = panel["scale"]
    if panel["aggregate"] == "latest":
        [col] = cols
        values = [v for v in col if v is not None]
        return (None if col[-1] is None else col[-1] * scale), (max(values) * scale if values else None)
    combine = COMBINE[panel["aggregate"]]
    recent = []
    for col in cols:  # a series read in turns shows its last reading for SEEN_FOR_S
        got = next(((ti, v) for ti, v in zip(reversed(t), reversed(col), strict=True) if v is not None), None)
        if got is not None and t[-1] - got[0] <= SEEN_FOR_S:
            recent.append(got[1] * scale)
    rows = [[c[i] for c in cols if c[i] is not None] for i in range(len(t))]
    peaks = [combine(r) for r in rows if r]
    return (combine(recent) if recent else None), (max(peaks) * scale if peaks else None)


def close(a: float, b: float, digits: int) -> bool:
    return abs(a - b) <= 0.5 * 10 ** -digits + 1e-6 * max(1.0, abs(b))


@pytest.mark.parametrize("name,gpus", [("h200", 1), ("two-gpus", 2), ("eight-gpus", 8)])
def test_every_headline_is_its_charts_aggregate_on_its_axis_and_every_series_is_drawn(name, gpus):
    checked = 0
    pcie_lines = 0
    for window, page in frames(name):
        assert len(window.gpus) == gpus
        for panel in panels(page):
            where = f"{name} t={window.t_s[-1]:.1f} s {panel['title']!r}"
            unit = re.search(r"\(([^)]*)\)", panel["title"]).group(1)
            now, peak = expected(window, panel)
            big, digits = shown(panel["big"])
            # the large number: the aggregate the panel names, of the series it draws
            assert (big is None) == (now is None), where
            if big is not None:
                assert panel["big"].endswith(f" {unit}"), f"{where}: {panel['big']!r} is not in {unit}"
                assert close(big, now, digits), f"{where}: shows {panel['big']!r}, the record gives {now}"
            if len(panel["keys"]) > 1:
                assert panel["title"].endswith(TITLE_WORDS[panel["aggregate"]]), where
            # the max beside it: the window's highest value of the same aggregate
            shown_peak, peak_digits = shown(panel["peak"])
            assert (shown_peak is None) == (peak is None), where
            if shown_peak is not None:
                assert close(shown_peak, peak, peak_digits), f"{where}: max {shown_peak}, the record gives {peak}"
                assert big is None or big <= shown_peak + 10 ** -digits, where
            # on the axis: a value the chart can show (the axis reads 0 to its top)
            if panel["axis"] is not None and shown_peak is not None:
                assert shown_peak <= panel["axis"] * (1 + 1e-9) + 10 ** -peak_digits, \
                    f"{where}: max {shown_peak} {unit} above the axis' {panel['axis']}"
            # every series with a reading in the window is drawn (a line or a dot, never lone moves)
            with_readings = sum(1 for k in panel["keys"] if any(v is not None for v in column(window, k)))
            if panel["title"].startswith("memory") and len(panel["keys"]) == 1:
                continue  # the per-GPU memory chart draws bars (one path per owner)
            drawn = [d for d in panel["lines"] if re.search(r"[ML][\d.]+,[\d.]+ L", d)]
            assert len(drawn) == with_readings, f"{where}: {with_readings} series read, {len(drawn)} drawn"
            if panel["title"].startswith("PCIe"):
                pcie_lines += len(drawn)
            checked += 1
    assert checked > 20 * gpus  # frames over the whole recording, every panel of each
    assert pcie_lines > 0


def _table_cells(page: str, row_class: str) -> list[list[str]]:
    rows = re.findall(rf'<tr class="{row_class}">(.*?)</tr>', page)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
            for r in rows]


@pytest.mark.parametrize("name", ["two-gpus", "eight-gpus"])
def test_the_table_sums_what_the_charts_draw_per_gpu_and_says_a_shared_badge_once(name):
    shared = 0
    for window, page in frames(name, every_s=7.0):
        [total] = _table_cells(page, "gpunb-gpu-sum")
        latest = {k: [g.columns[k][-1] for g in window.gpus] for k in ("mem_used_mib", "power_w")}
        if all(v is not None for v in latest["mem_used_mib"]):
            assert close(float(total[2].split(" / ")[0].replace(",", "")), sum(latest["mem_used_mib"]) / 1024, 1)
        if all(v is not None for v in latest["power_w"]):
            assert close(float(total[4].split(" / ")[0].replace(",", "")), sum(latest["power_w"]), 0)
        overview = page.split('class="gpunb-per-gpu"')[0]  # each GPU's own blocks keep their badges
        badges = overview.count('class="gpunb-badge"')
        assert badges <= 1 or len({b for b in re.findall(r"clocks held back: [^<]*", overview)}) > 1, \
            f"{name}: the same badge {badges} times"
        shared += 'class="gpunb-shared-badge"' in page
    assert shared  # the recording's training phase holds every GPU's clocks back (power cap)


def test_this_kernel_unknown_on_some_gpus_is_explained_not_mixed_in_silently():
    for window, _ in frames("eight-gpus", until_s=20.0, every_s=20.0):
        for g in window.gpus[4:]:  # as when NVML gave no process list for GPUs 4-7
            g.columns["mem_own_mib"] = [None] * len(g.columns["mem_own_mib"])
        page = monitor_html(window, state="stopped")
        own = [row[3] for row in _table_cells(page, "gpunb-gpu-row")]
        assert own[:4] != ["n/a"] * 4 and own[4:] == ["n/a"] * 4
        assert "this kernel n/a on GPU4–7: NVML did not say which processes hold its memory" in page
        [total] = _table_cells(page, "gpunb-gpu-sum")
        assert total[3] == "n/a"  # a partial sum would read as the whole
