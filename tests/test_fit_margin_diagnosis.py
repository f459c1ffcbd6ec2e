"""``benchmarks/fit_margin_diagnosis.py``'s arithmetic on the H200 run it made (issue 24): the
search's terms recomputed from the recorded trials, and the measured curve against the line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_margin_diagnosis as diagnosis  # noqa: E402

RUN = ROOT / "benchmarks" / "results" / "h200_s4_fit_margin_diagnosis.json"


@pytest.fixture(scope="module")
def bn_convnet():
    return next(m for m in json.loads(RUN.read_text())["models"] if m["model"] == "bn_convnet")


def test_the_terms_are_those_the_search_worked_with(bn_convnet):
    terms = diagnosis.terms(bn_convnet["gpufit"]["fit"], bn_convnet["truth"]["max"])
    # the allocated line ends 16 % above the fresh-process maximum; the overhead measured at the
    # largest trial (1.16x) puts the reserved line's end on it
    assert terms["full"] == pytest.approx(844.1, abs=0.5)
    assert terms["reserved_target"] == pytest.approx(726.3, abs=0.5)
    assert terms["overhead_at_largest"] == pytest.approx(1.162, abs=0.001)
    assert terms["pct_of_truth"]["recommended"] == pytest.approx(100 * 695 / 725)
    assert terms["verified"] == 717 and terms["safety"] == 0.03


def test_the_curve_shows_a_straight_line_and_where_it_ran_out(bn_convnet):
    measures = [{"batch": r["batch"], "trial": _trial(r)} for r in bn_convnet["curve"]]
    rows = diagnosis.curve(measures, bn_convnet["gpufit"]["fit"]["line_allocated"])
    fitting = [r for r in rows if r["fits"]]
    assert [r["batch"] for r in rows] == [41, 249, 499, 665, 790]
    assert all(abs(r["growth_mib_per_sample"] - 24.18) < 0.05 for r in fitting[1:])
    assert all(abs(r["line_error_pct"]) < 0.5 for r in fitting) and not rows[-1]["fits"]


def _trial(row: dict) -> dict:
    """A curve row back as the trial readings it was made from (the report keeps the rows)."""
    gib = 2**30
    return {"fits": row["fits"], "verdict": row["verdict"], "caught_ooms": row["caught_ooms"],
            "cache_releases": row["cache_releases"],
            "peak_allocated_bytes": round(row["allocated_gib"] * gib),
            "peak_before_step_bytes": round(row["before_step_gib"] * gib) or None,
            "peak_reserved_bytes": round(row["reserved_gib"] * gib),
            "first_step_peak_reserved_bytes": round(row["first_step_reserved_gib"] * gib)}
