"""One verdict per check run: the view, ``summary_line()``, ``to_dict()`` (``gpunb check --json``)
and the CLI's exit code all come from the same record and say the same thing.

Generated check-result sets (every mix of statuses, with or without the laptop's no-GPU state,
with or without a GPU required) and each named machine state of the fake NVML.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunb.analysis.checks.checklist import check
from gpunb.analysis.checks.records import STATUSES, CheckReport, CheckResult
from gpunb.analysis.machine import NO_GPU
from gpunb.cli import EXIT_CHECK_FAILED, EXIT_OK, exit_code
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario
from gpunb.views.check_view import render_html, render_text
from gpunb.views.per_gpu import without_qualifiers

LAPTOP = {"state": "no_gpu", "sentence": NO_GPU.sentence, "severity": "info", "fix": ""}
LAPTOP_DRIVER = CheckResult("driver", "NVIDIA driver sees the GPUs", "skip", NO_GPU.sentence, {"machine": LAPTOP})

results = st.builds(
    CheckResult,
    id=st.sampled_from(["torch_cuda", "temperature", "host", "disk", "shm", "nvml_py", "mig", "power"]),
    title=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30),
    status=st.sampled_from(STATUSES),
    summary=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40),
)


@st.composite
def reports(draw) -> CheckReport:
    checks = draw(st.lists(results, max_size=12))
    if draw(st.booleans()):  # a laptop: the driver check says the machine's no-GPU state
        checks.insert(0, LAPTOP_DRIVER)
    return CheckReport(tuple(checks), draw(st.floats(0, 60)), draw(st.booleans()))


def assert_one_verdict(report: CheckReport) -> None:
    counts, line = report.counts, report.summary_line()
    data = json.loads(report.to_json())
    text, html = render_text(report), render_html(report)
    # the JSON says the record's counts, its verdict and its line
    assert data["summary"] == counts and data["ok"] == report.ok and data["verdict"] == line
    assert sum(counts.values()) == len(report.checks) == len(data["checks"])
    # the view's tally is the summary line, in text and HTML
    assert text.splitlines()[1].startswith(f"gpunb check · {line}".rstrip(" ·"))
    assert line in html
    # ok means no failure, everywhere; the exit code follows it
    assert report.ok == (counts["fail"] == 0)
    assert exit_code(report) == (EXIT_OK if report.ok else EXIT_CHECK_FAILED)
    assert ("problem" in line) == (not report.ok)
    # the text form accounts for every check: a line each, or its title among the skipped
    flat = "".join(text.split())  # the text wraps (at hyphens too)
    for c in report.checks:
        assert "".join(without_qualifiers(c.title).split()) in flat


@settings(max_examples=200, deadline=None)
@given(reports())
def test_view_summary_json_and_exit_code_agree(report):
    assert_one_verdict(report)


@pytest.mark.parametrize("name", ["no-driver", "h200", "two-gpus", "gpu-lost", "second-gpu-lost", "eight-gpus",
                                  "power-not-supported", "mig", "busy"])
@pytest.mark.parametrize("require_gpu", [False, True])
def test_each_machine_state_has_one_verdict(name, require_gpu):
    report = check(quick=True, nvml=NvmlSession(scenario(name)), environ={}, require_gpu=require_gpu)
    assert_one_verdict(report)
    if name == "no-driver":  # a laptop passes unless a GPU is required
        assert report.ok is (not require_gpu) and report.machine_state == "no_gpu"
        assert render_text(report).splitlines()[0] == (NO_GPU.sentence if not require_gpu else
                                                       "No NVIDIA GPU on this machine, and this run requires one.")

