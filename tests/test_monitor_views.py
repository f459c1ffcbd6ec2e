"""The monitor's views: chart images with scales, limits and gaps; layout; escaping; text line."""

from __future__ import annotations

import html
import re

import pytest

from gpunb.analysis.machine import NO_GPU
from gpunb.analysis.monitor.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.views import chart
from gpunb.views.monitor_layout import caption, clock_event_badge, monitor_html, monitor_text, panel_html
from gpunb.views.sparkline import HEIGHT, MAX_POINTS, PANEL_W, WIDTH, SparkPanel, memory_scale, series_cell
from tests.chart_html import SVG, images, parse, runs_of, svg_of, words


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


def charts(page: str) -> list[dict]:
    return images(page, "gpunb-chart")


def test_a_series_is_an_image_with_scale_latest_value_and_a_gap():
    t = [float(i) for i in range(10)]
    values = [10, 20, 30, None, None, 50, 60, 70, 80, 90]
    cell = series_cell(t, values, label="utilization", unit="%", span_s=10, y_max=100)
    [image] = charts(cell)
    alt = image["alt"]
    assert "latest 90 %" in alt and "min 10" in alt and "max 90" in alt and "2 of 10 points have no reading" in alt
    assert "scale 0 to 100 %" in alt and image["alt"] == image["title"]  # the hover tip says it too
    text = words(cell)
    assert text.startswith("utilization 90 % max 90") and "100 0" in text  # title, latest, window max, scale
    runs = runs_of(svg_of(image), chart.BLUE)
    assert [len(r) for r in runs] == [3, 5]  # the gap splits the line
    ys = [y for _, y in runs[1]]
    assert ys == sorted(ys, reverse=True)  # rising values are drawn higher (smaller y)
    base, top = HEIGHT - 1.0, 2.0
    assert ys[-1] == pytest.approx(base - 0.9 * (base - top), abs=0.06)  # 90 % of the scale


def test_a_series_without_readings_says_so_and_keeps_its_place():
    cell = series_cell([0.0, 1.0, 2.0], [None, None, None], label="power", unit="W", span_s=10)
    assert charts(cell) == [] and "no reading" in words(cell) and words(cell).startswith("power n/a")
    first = series_cell([], [], label="power", unit="W", span_s=10)
    assert charts(first) == [] and "waiting for the first samples" in words(first)
    assert f"height:{HEIGHT}px" in first  # the same box as the chart that replaces it: no jump
    one = series_cell([0.0], [5.0], label="power", unit="W", span_s=10)
    [dot] = runs_of(svg_of(charts(one)[0]), chart.BLUE)  # one reading: a dot (round caps), not an empty box
    assert len(dot) == 2 and dot[0] == dot[1]


def test_long_series_are_merged_to_max_points_keeping_peaks():
    n = 5000
    t = [i * 0.01 for i in range(n)]
    values = [1.0] * n
    values[2345] = 99.0
    cell = series_cell(t, values, label="x", unit="", span_s=50, y_max=100)
    points = [p for run in runs_of(svg_of(charts(cell)[0]), chart.BLUE) for p in run]
    assert len(points) <= MAX_POINTS + 1
    assert min(y for _, y in points) < 10  # the 99 peak survived


def test_labels_and_gpu_names_are_escaped():
    cell = series_cell([0.0, 1.0], [1.0, 2.0], label='<script>alert("x")</script>', unit="&", span_s=1)
    assert "<script>" not in cell and "&lt;script&gt;" in cell
    page = monitor_html(window_of("h200", gpu_name='<img src=x onerror="alert(1)">'))
    found = parse(page)
    assert "script" not in found.tags
    assert all(i["src"].startswith("data:image/svg+xml;base64,") for i in found.images)  # only our charts
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


def test_memory_is_split_and_scaled_to_what_is_used_with_the_capacity_beside_it():
    w = window_of("busy", until=20.0)  # training (our recorded pid) + another user's 40 GiB
    page = monitor_html(w)
    memory = charts(page)[0]
    strokes = [p.get("stroke") for p in svg_of(memory).iter(SVG + "path") if p.get("stroke-width") not in ("1",)]
    assert strokes == [chart.BLUE, chart.ORANGE]  # this kernel's bars, other processes' bars
    alt = memory["alt"]
    assert "this kernel 9.3" in alt and "other processes 40.0" in alt and "free" in alt and "of 140.4 GiB" in alt
    top = float(re.search(r"scale 0 to ([\d.]+) GiB", alt).group(1))
    assert 49.3 < top < 140  # about 49 GiB in use: a scale near that, not the capacity
    gauge = images(page, "gpunb-gauge")[0]
    assert "GiB used of 140.4 GiB" in gauge["alt"] and "of 140" in words(page)
    assert "this kernel" in words(page) and "other processes" in words(page)  # the legend


def test_memory_scale_rounds_up_and_takes_the_capacity_near_it():
    assert memory_scale(2.5 * 1024, 140 * 1024) == 3 * 1024
    assert memory_scale(None, 140 * 1024) == 1024  # at least 1 GiB
    assert memory_scale(120 * 1024, 140 * 1024) == 140 * 1024
    assert chart.nice_ceiling(7.2) == 8 and chart.nice_ceiling(0.03) == pytest.approx(0.03)


def test_power_limit_and_slowdown_temperature_are_dashed_lines_at_their_values():
    page = monitor_html(window_of("h200"))
    power, temp = charts(page)[2], charts(page)[3]
    for image, value, top in ((power, 700, 800), (temp, 89, 100)):
        limits = [p for p in svg_of(image).iter(SVG + "path") if p.get("stroke") == chart.RED]
        assert len(limits) == 1 and limits[0].get("stroke-dasharray")
        y = float(limits[0].get("d").split(",")[1].split("H")[0])
        assert y == pytest.approx(HEIGHT - 1 - value / top * (HEIGHT - 3), abs=0.06)
    assert "power limit 700 W" in power["alt"] and "slowdown at 89 °C" in temp["alt"]
    assert "limit" in words(page) and "slowdown" in words(page)  # the legend names them


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
            panel_html(live, sampler.gpu_series(), nvml=sampler.status, gpu_count=1)
    once = panel()
    once.feed(first, rows)
    draw = lambda p: panel_html(p, sampler.gpu_series(), nvml=sampler.status, gpu_count=1, caption_text="x")  # noqa: E731
    assert draw(live) == draw(once)
    assert live.k == 2 and len(live.tracks["gpu0_util_pct"].items) <= 101


def test_throttle_badge_names_reasons_in_words():
    assert clock_event_badge(0) == "" and clock_event_badge(None) == ""
    assert clock_event_badge(0x1) == ""  # idle is not a throttle
    badge = clock_event_badge(0x4, {"power cap": 0.4})
    assert "power cap" in badge and "40%" in badge and "power limit" in badge
    assert "hw thermal" in clock_event_badge(0x40 | 0x4)


def test_the_badge_has_its_place_before_it_appears():
    before = monitor_html(window_of("h200", until=5.0))
    during = monitor_html(window_of("h200", until=18.0))  # the trace hits the power cap at ~17 s
    assert "no throttling" in before and "clocks held back: power cap" in during
    place = re.compile(r'<div style="display:flex;flex-wrap:wrap;align-items:baseline;gap:2px 8px;min-height:18px;')
    assert place.search(before) and place.search(during)  # the same reserved line in both
    assert len(charts(during)) == 5 + 2 + 2  # five GPU charts, two host charts, PCIe both ways (no NVLink)
    assert "stopped at" in monitor_html(window_of("h200"), state="stopped")


def test_captions_stay_true_in_a_saved_notebook():
    live = caption("live", hz=2, seconds=300, started_unix=0.0, t_last=10.0)
    stopped = caption("stopped", hz=2, seconds=300, started_unix=0.0, t_last=10.0)
    assert "live" not in live and "last sample" in live and "2 Hz" in live and "5 min window" in live
    assert "a notebook saved now keeps this frame" in live  # a frame saved mid-run does not read as live
    assert "stopped at" in stopped and "2 Hz" in stopped and "5 min window" in stopped
    assert "waiting for the first sample" in caption("live", hz=2, seconds=60, started_unix=None, t_last=None)


def test_time_axis_ends_at_the_last_sample():
    w = window_of("h200", seconds=120, until=130)
    text = words(monitor_html(w))
    assert re.search(r"−2 min \d\d:\d\d:\d\d", text)  # the window's start, the last sample's time


def _screen_xs(image: dict, stroke: str) -> list[float]:
    """Where a line's points land in the picture, after its group's transform."""
    root = svg_of(image)
    group = next(g for g in root.iter(SVG + "g") if any(p.get("stroke") == stroke for p in g.iter(SVG + "path")))
    transform = group.get("transform")
    scale = re.search(r"scale\(([\d.]+),1\)", transform)
    shift = float(re.search(r"translate\((-?[\d.]+),0\)", transform).group(1))
    stretch = float(scale.group(1)) if scale else 1.0
    return [(x + shift) * stretch for run in runs_of(root, stroke) for x, _ in run]


def test_a_short_run_fills_the_chart_from_its_first_sample():
    # 34 s of samples in the default 2-minute window: the axis spans the 34 s, not 2 min
    page = monitor_html(window_of("h200", seconds=120, until=34))
    assert re.search(r"−34 s \d\d:\d\d:\d\d", words(page)) and "−2 min" not in words(page)
    util = charts(page)[1]
    xs = _screen_xs(util, chart.GREEN)
    assert min(xs) < 0.05 * WIDTH and max(xs) > 0.95 * WIDTH  # first sample left, last one right
    assert 'vector-effect="non-scaling-stroke"' in svg_of_text(util)  # the stretch keeps the line's width
    # once the window is full it scrolls: the last 2 minutes, the oldest sample at the left edge
    full = charts(monitor_html(window_of("h200", seconds=120, until=200)))[1]
    xs = _screen_xs(full, chart.GREEN)
    assert max(xs) > 0.95 * WIDTH and min(xs) < 0.05 * WIDTH and "last 2 min" in full["alt"]


def svg_of_text(image: dict) -> str:
    import base64

    return base64.b64decode(image["src"].split(",", 1)[1]).decode()


def test_charts_are_large_enough_to_read_and_panels_wrap_in_a_narrow_window():
    assert WIDTH >= 120 and HEIGHT >= 50  # the first version's 100x38 px could not be read
    # five panels side by side in the 934 px JupyterLab leaves at 1366 px with its file browser open
    assert 5 * PANEL_W + 4 * 6 <= 890 and 3 * PANEL_W + 2 * 6 <= 590  # (890: 1100 px, file browser closed)
    page = monitor_html(window_of("eight-gpus"))
    # eight GPUs: a panel per metric with a line per GPU, a table of the values now, then each
    # GPU's five charts in a <details>; CPU, RAM and PCIe both ways (a line per GPU) in the host's row
    assert len(charts(page)) == 5 + 8 * 5 + 2 + 2 and "GPU 7" in page
    overview, rest = page.split('<details class="gpunb-per-gpu"', 1)
    assert 'class="gpunb-gpu"' not in overview and rest.count('class="gpunb-gpu"') == 8
    assert overview.count('class="gpunb-gpu-row"') == 8 and "8 × NVIDIA H200" in overview
    util = next(c for c in charts(overview) if c["alt"].startswith("GPU utilization"))
    assert all(f"GPU {i} " in util["alt"] for i in range(8)) and len(list(svg_of(util).iter(SVG + "path"))) >= 8
    # fixed-width panels in rows that wrap, none cut off
    widths = {int(w) for w in re.findall(r'class="gpunb-panel" style="box-sizing:border-box;width:(\d+)px', page)}
    assert widths == {PANEL_W} and page.count("flex-wrap:wrap") >= 9


def test_the_live_frame_draws_each_gpu_only_when_asked():
    from gpunb.views.monitor_layout import panel_html, window_rows

    window = window_of("eight-gpus")
    panel = SparkPanel(window_s=window.seconds, hz=window.hz, gpus=window.gpus, ram_total_mib=window.ram_total_mib,
                       cpu_count=window.cpu_count)
    panel.feed(0, window_rows(window))
    kw = {"nvml": window.nvml, "gpu_count": window.gpu_count}
    live = panel_html(panel, window.gpus, per_gpu="button", **kw)
    assert len(charts(live)) == 5 + 2 + 2 and 'class="gpunb-gpu"' not in live and "Each GPU" in live
    shown = panel_html(panel, window.gpus, per_gpu="open", **kw)
    assert '<details class="gpunb-per-gpu" open' in shown and shown.count('class="gpunb-gpu"') == 8
    one = monitor_html(window_of("h200"))  # one GPU: its own row, no overview
    assert "gpunb-overview" not in one and one.count('class="gpunb-gpu"') == 1 and len(charts(one)) == 5 + 2 + 2


def test_text_line_and_no_gpu_message():
    text = monitor_text(window_of("h200", until=18.0))
    assert re.search(r"GPU0 NVIDIA H200: util \d+% · mem \d+\.\d/140\.4 GiB \(this kernel \d+\.\d\)", text)
    assert "/700 W" in text and "clocks held back: power cap" in text and "host: CPU" in text
    lost = monitor_text(window_of("power-not-supported"))
    assert "power n/a ·" in lost
    none = window_of("no-driver")
    assert NO_GPU.sentence in monitor_text(none)
    page = monitor_html(none)  # a laptop: the machine's statement, no driver or Docker advice
    assert page.count(html.escape(NO_GPU.sentence)) == 1 and "--gpus all" not in page and len(charts(page)) == 2


def test_two_gpus_one_lost():
    page = monitor_html(window_of("second-gpu-lost"))
    assert page.count('class="gpunb-gpu"') == 2 and page.count('class="gpunb-gpu-row"') == 2
    assert "NVIDIA H200" in page and "GPU 1" in page and "lost (no readings)" in page
    drawn = charts(page)
    assert len(drawn) == 5 + 5 + 2 + 2  # the overview (GPU 0's lines) and GPU 0's; GPU 1 has boxes saying no reading
    assert all(list(svg_of(i).iter(SVG + "path")) for i in drawn)
    assert words(page).count("no reading") >= 4
    assert "GPU 1 is lost" in page


def test_the_monitor_says_fake_when_test_stand_ins_answer():
    from gpunb.views.monitor_layout import panel_notes

    s = Sampler(NvmlSession(scenario("h200")), hz=2.0)
    assert s.fake == ("fake NVML",)
    s.tick()
    w = s.window(10.0)
    assert monitor_text(w).startswith("fake GPU readings (fake NVML)")
    assert panel_notes(w.notes, [], w.fake)[0].startswith("fake: these figures come from gpunb's test stand-ins")
