"""The sparkline views: valid SVG, gaps, labels with units, escaping, throttle badge."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from gpunb.analysis.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.views.sparkline import (
    MAX_POINTS,
    SparkPanel,
    clock_event_badge,
    monitor_html,
    monitor_text,
    sparkline_svg,
)

SVG = "{http://www.w3.org/2000/svg}"


def window_of(name: str, seconds: float = 30.0, until: float = 20.0, gpu_name: str | None = None):
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731
    fake = scenario(name, clock=clock)
    if gpu_name is not None:
        for g in fake.gpus:
            g.facts["name"] = gpu_name
    sampler = Sampler(NvmlSession(fake), clock=clock, own_pids=[load_trace()["pid"]], process_refresh_s=0)
    while t[0] <= until:
        sampler.tick()
        t[0] += 0.5
    return sampler.window(seconds)


def runs_of(root) -> list[list[tuple[float, float]]]:
    """The path's runs of points ("M" starts one), as (x, y) pairs."""
    runs = []
    for path in root.iter(SVG + "path"):
        for token in path.get("d").split():
            x, y = (float(v) for v in token[1:].split(","))
            if token[0] == "M":
                runs.append([])
            runs[-1].append((x, y))
    return runs


def test_sparkline_is_valid_svg_with_title_latest_label_and_gap():
    t = [float(i) for i in range(10)]
    values = [10, 20, 30, None, None, 50, 60, 70, 80, 90]
    svg = sparkline_svg(t, values, label="utilization", unit="%", span_s=10, y_max=100)
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    title = root.find(SVG + "title").text
    assert "latest 90 %" in title and "min 10" in title and "max 90" in title
    assert "2 of 10 points have no reading" in title
    texts = [el.text for el in root.iter(SVG + "text")]
    assert texts == ["utilization", "90 %"]
    runs = runs_of(root)
    assert [len(r) for r in runs] == [3, 5]  # the gap splits the line
    ys = [y for _, y in runs[1]]
    assert ys == sorted(ys, reverse=True)  # rising values are drawn higher (smaller y)
    assert ys[-1] == pytest.approx(45 - 0.9 * 30)  # 90 % of a 30 px plot above the 45 px base


def test_sparkline_without_readings_says_na():
    svg = sparkline_svg([0.0, 1.0], [None, None], label="power", unit="W", span_s=10)
    root = ET.fromstring(svg)
    assert [el.text for el in root.iter(SVG + "text")] == ["power", "n/a"]
    assert list(root.iter(SVG + "path")) == []
    assert "no reading" in root.find(SVG + "title").text


def test_long_series_are_merged_to_max_points_keeping_peaks():
    n = 5000
    t = [i * 0.01 for i in range(n)]
    values = [1.0] * n
    values[2345] = 99.0
    svg = sparkline_svg(t, values, label="x", unit="", span_s=50, y_max=100)
    points = [p for run in runs_of(ET.fromstring(svg)) for p in run]
    assert len(points) <= MAX_POINTS + 1
    assert min(y for _, y in points) < 20  # the 99 peak survived


def test_labels_and_gpu_names_are_escaped():
    svg = sparkline_svg([0.0], [1.0], label='<script>alert("x")</script>', unit="&", span_s=1)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    ET.fromstring(svg)
    w = window_of("h200", gpu_name='<img src=x onerror="alert(1)">')
    page = monitor_html(w)
    assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "<script" not in page


def test_memory_chart_splits_this_kernel_other_processes_free():
    w = window_of("busy", until=20.0)  # training (our recorded pid) + another user's 40 GiB
    root = ET.fromstring(monitor_html(w))
    memory = next(root.iter(SVG + "svg"))
    strokes = [p.get("stroke") for p in memory.iter(SVG + "path")]
    assert strokes == ["#2f7ed8", "#e4572e"]  # this kernel's bars, other processes' bars
    title = memory.find(SVG + "title").text
    assert "this kernel 9.3" in title and "other processes 40.0" in title and "free" in title
    assert [el.text for el in memory.iter(SVG + "text")][1].endswith("/ 140.4 GiB")


def test_incremental_drawing_equals_drawing_at_once():
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731
    sampler = Sampler(NvmlSession(scenario("h200", clock=clock)), clock=clock, hz=10, own_pids=[load_trace()["pid"]])
    for _ in range(300):
        sampler.tick()
        t[0] += 0.1
    def panel():
        return SparkPanel(window_s=20, hz=10, gpus=sampler.gpu_series(), ram_total_mib=1000.0, cpu_count=2)
    live = panel()
    first, rows = sampler.rows_since(0)
    for i in range(len(rows["t_s"])):  # one row at a time, as the sampler thread sees them
        live.feed(first + i, {k: v[i : i + 1] for k, v in rows.items()})
        if i % 37 == 0:
            live.html(sampler.gpu_series(), nvml=sampler.status, gpu_count=1)
    once = panel()
    once.feed(first, rows)
    draw = lambda p: p.html(sampler.gpu_series(), nvml=sampler.status, gpu_count=1, caption_text="x")  # noqa: E731
    assert draw(live) == draw(once)
    assert live.k == 2 and len(live.tracks["gpu0_util_pct"].items) <= 101


def test_throttle_badge_names_reasons_in_words():
    assert clock_event_badge(0) == "" and clock_event_badge(None) == ""
    assert clock_event_badge(0x1) == ""  # idle is not a throttle
    badge = clock_event_badge(0x4, {"power cap": 0.4})
    assert "power cap" in badge and "40%" in badge and "power limit" in badge
    assert "hw thermal" in clock_event_badge(0x40 | 0x4)


def test_panel_shows_badge_while_training_at_the_power_cap():
    w = window_of("h200", until=18.0)  # the trace hits the power cap at ~17 s
    page = monitor_html(w)
    assert "clocks held back: power cap" in page
    assert page.count("<svg") == 5 + 2  # five GPU charts, two host charts
    assert "live at 2 Hz" in page
    assert "stopped" in monitor_html(w, state="stopped")


def test_text_line_and_no_gpu_message():
    text = monitor_text(window_of("h200", until=18.0))
    assert re.search(r"GPU0 NVIDIA H200: util \d+% · mem \d+\.\d/140\.4 GiB \(this kernel \d+\.\d\)", text)
    assert "/700 W" in text and "clocks held back: power cap" in text and "host: CPU" in text
    lost = monitor_text(window_of("power-not-supported"))
    assert "power n/a ·" in lost
    none = window_of("no-driver")
    assert "No GPU to show" in monitor_text(none)
    page = monitor_html(none)
    assert "No GPU to show" in page and "libnvidia-ml.so.1" in page and page.count("<svg") == 2


def test_two_gpus_one_lost():
    page = monitor_html(window_of("second-gpu-lost"))
    root = ET.fromstring(page)
    assert page.count('class="gpunb-gpu"') == 2
    assert "GPU 0 · NVIDIA H200" in page and "GPU 1 · GPU 1" in page and "lost (no readings)" in page
    svgs = list(root.iter(SVG + "svg"))
    assert len(svgs) == 5 + 5 + 2
    assert all(list(svg.iter(SVG + "path")) for svg in svgs[:5])  # GPU 0 draws
    assert not any(list(svg.iter(SVG + "path")) for svg in svgs[5:10])  # GPU 1: gaps only
    assert "GPU 1 is lost" in page
