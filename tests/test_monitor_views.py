"""The sparkline views: valid SVG, gaps, labels with units, escaping, throttle badge."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpunb.analysis.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.views.sparkline import (
    WIDTH,
    clock_event_badge,
    memory_svg,
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


def test_sparkline_is_valid_svg_with_title_latest_label_and_gap():
    t = [float(i) for i in range(10)]
    values = [10, 20, 30, None, None, 50, 60, 70, 80, 90]
    svg = sparkline_svg(t, values, label="utilization", unit="%", span_s=10, y_max=100)
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    title = root.find(SVG + "title").text
    assert "latest 90 %" in title and "min 10" in title and "max 90" in title and "2 of 10 readings missing" in title
    texts = [el.text for el in root.iter(SVG + "text")]
    assert texts == ["utilization", "90 %"]
    lines = root.findall(SVG + "polyline")
    assert [len(line.get("points").split()) for line in lines] == [3, 5]  # the gap splits the line
    # y scale: 90 % of y_max sits near the top of the plot, 10 % near the bottom
    ys = [float(p.split(",")[1]) for p in lines[1].get("points").split()]
    assert ys[-1] < ys[0]


def test_sparkline_without_readings_says_na():
    svg = sparkline_svg([0.0, 1.0], [None, None], label="power", unit="W", span_s=10)
    root = ET.fromstring(svg)
    assert [el.text for el in root.iter(SVG + "text")] == ["power", "n/a"]
    assert root.findall(SVG + "polyline") == []
    assert "no reading" in root.find(SVG + "title").text


def test_long_series_are_reduced_to_about_one_point_per_pixel_keeping_peaks():
    n = 5000
    t = [i * 0.01 for i in range(n)]
    values = [1.0] * n
    values[2345] = 99.0
    svg = sparkline_svg(t, values, label="x", unit="", span_s=50, y_max=100)
    points = ET.fromstring(svg).find(SVG + "polyline").get("points").split()
    assert len(points) <= WIDTH
    assert min(float(p.split(",")[1]) for p in points) < 20  # the 99 peak survived


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
    g = w.gpus[0]
    svg = memory_svg(g, w.t_s, w.seconds)
    root = ET.fromstring(svg)
    fills = [p.get("fill") for p in root.findall(SVG + "polygon")]
    assert set(fills) == {"#2f7ed8", "#e4572e"}  # own and other areas
    title = root.find(SVG + "title").text
    assert "this kernel 9.3" in title and "other processes 40.0" in title and "free" in title
    assert "/ 140.4 GiB" in svg


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
