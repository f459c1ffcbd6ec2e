"""%gpucheck's report reads at a glance: the finding first, no GPU said once, values every GPU
shares said once, the links between GPUs as a matrix, skipped checks one click away."""

from __future__ import annotations

import re

import pytest

from gpunb.analysis.checks.checklist import check
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario
from gpunb.views.check_view import NO_GPU, link_matrix, render_html, render_text
from gpunb.views.per_gpu import fold, without_qualifiers


def report_of(name: str):
    return check(quick=True, nvml=NvmlSession(scenario(name)), environ={})


def test_no_gpu_is_its_own_state_said_once():
    report = report_of("no-driver")
    text, html = render_text(report), render_html(report)
    assert text.splitlines()[0] == NO_GPU
    assert "problem" not in text.splitlines()[1] and "fail" not in text.lower()  # not a red failure
    assert len(text.splitlines()) < 20 and " SKIP " not in text  # one line of skips, not 20 rows
    head = html[: html.index("</div>")]
    assert NO_GPU in head and "#e0413a" not in head  # the headline is not red
    # the skipped checks are one click away; a laptop is not told to install a driver or Docker
    assert re.search(r"<summary[^>]*>.*\d+ checks skipped", html) and "--gpus all" not in html


def test_the_first_line_is_the_failing_checks_finding_not_its_name():
    text = render_text(report_of("two-gpus"))  # a GPU beside this machine's CPU torch
    first = text.splitlines()[0]
    assert re.fullmatch(r"torch \S+ is a CPU-only build: every model trains on the CPU", first)
    assert "torch is a CUDA build this driver supports" not in first


def test_eight_gpus_say_each_shared_value_once():
    report = report_of("eight-gpus")
    text = render_text(report)
    assert "all 8 GPUs: 35 °C" in text and "all 8 GPUs: 81 W of 700 W limit" in text
    assert "8 × NVIDIA H200, 140.4 GiB" in text and "all 28 pairs: PCIe; peer access n/a" in text
    for line in text.splitlines():  # no row lists the GPUs one by one any more
        assert len(re.findall(r"GPU\d+:", line)) <= 1, line
        assert "(slowdown at" not in line  # asides go to the details
    assert len(text.splitlines()) <= 30


def test_links_are_a_matrix_in_the_details():
    report = report_of("eight-gpus")
    matrix = link_matrix(report["gpu_links"])
    assert matrix[0] == ["", *(f"GPU{i}" for i in range(8))] and len(matrix) == 9
    assert matrix[1][1] == "·" and matrix[1][2] == "PCIe" and matrix[8][1] == "PCIe"
    html = render_html(report)
    assert html.count("<th") == 16 + 1  # header row and one header cell per GPU row
    nvlink = link_matrix(report_of("h200x2-nvlink")["gpu_links"])
    assert nvlink == [["", "GPU0", "GPU1"], ["GPU0", "·", "NV18"], ["GPU1", "NV18", "·"]]


def test_full_readings_stay_in_the_details():
    html = render_html(report_of("eight-gpus"))
    assert "GPU7: 35 °C (slowdown at 89 °C)" in html  # the full reading, inside a closed <details>
    full = html.index("GPU7: 35 °C (slowdown at 89 °C)")
    assert html.rfind("<details", 0, full) > html.rfind("</details>", 0, full)


def test_fold():
    assert fold("GPU0: 35 °C (slowdown at 89 °C); GPU1: 37 °C (slowdown at 89 °C); GPU2: 36 °C (x)") == \
        "all 3 GPUs: 35–37 °C"
    assert fold("GPU0: on; GPU1: on; GPU2: off; GPU3: on; GPU4: on; GPU5: on") == "GPU0, GPU1, GPU3–5: on; GPU2: off"
    assert fold("GPU0: on; GPU1: on") == "both GPUs: on"
    assert fold("GPU0: 2 other process(es) hold 9.3 GiB") == "GPU0: 2 other process(es) hold 9.3 GiB"
    assert fold("unset: the default (see docs)") == "unset: the default"
    assert without_qualifiers("a (b (c)) d") == "a d"


@pytest.mark.parametrize("name", ["h200", "busy", "mig", "gpu-lost", "second-gpu-lost", "power-not-supported"])
def test_every_scenario_renders_and_a_lost_gpu_stays_a_failure(name):
    report = report_of(name)
    text, html = render_text(report), render_html(report)
    assert text.splitlines()[1].startswith("gpunb check · ") and "<script" not in html
    if name == "gpu-lost":
        assert text.splitlines()[0] != NO_GPU and "problem" in text.splitlines()[1]
