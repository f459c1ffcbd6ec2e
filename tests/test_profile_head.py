"""The profile's default view: the verdict, one stacked time bar, at most three big numbers, the
advice; every measured row one click away. Plain HTML (no inline <svg>: JupyterLab's sanitizer
strips it in an untrusted notebook), and the bar's parts add up to the whole they are shares of,
for generated shares (overlapping ones included: printing a tensor is output and a sync)."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from gpunb.views.profile_view import TIME_PARTS, big_numbers, profile_html, time_parts
from tests.test_profile_verdict import _profile


def _generated(rng: random.Random):
    loop = rng.choice([0.0, 0.01, 1.0, 30.0, rng.uniform(0.001, 100.0)])
    parts = [rng.choice([0.0, rng.uniform(0, loop), rng.uniform(0, 2 * loop + 0.01)]) for _ in range(3)]
    p = _profile(loop=max(loop, 0.001))
    if rng.random() < 0.5:  # no GPU: the third number is the host's peak
        p = dataclasses.replace(p, gpu=None, gpu_absent="no NVIDIA GPU on this machine")
    shares = dataclasses.replace(p.shares, loop_s=loop, data_wait_s=parts[0], sync_s=parts[1], output_s=parts[2],
                                 sync_n=3 if parts[1] else 0, output_writes=2 if parts[2] else 0)
    return dataclasses.replace(p, shares=shares)


@pytest.mark.parametrize("seed", range(3))
def test_the_time_bar_adds_up_and_the_head_has_at_most_three_numbers(seed):
    rng = random.Random(seed)
    for _ in range(60):
        p = _generated(rng)
        parts = time_parts(p)
        html = profile_html(p)
        assert "<svg" not in html  # survives an untrusted notebook
        if not parts:
            assert "gpunb-time-bar" not in html
            continue
        assert [name for name, _, _ in parts] == [name for name, _ in TIME_PARTS]
        assert all(t >= 0 and 0 <= share <= 1 for _, t, share in parts)
        assert sum(share for _, _, share in parts) == pytest.approx(1.0)
        measured = p.shares.data_wait_s + p.shares.sync_s + p.shares.output_s
        if measured <= p.shares.loop_s:  # the shares are of the loop, and compute is what is left
            assert parts[-1][1] == pytest.approx(p.shares.loop_s - measured)
        widths = [float(w) for w in re.findall(r"class='gpunb-time-part'[^>]*width:([\d.]+)%", html)]
        assert sum(widths) == pytest.approx(100.0, abs=0.01)
        legend = re.search(r"class='gpunb-time-legend'[^>]*>(.*?)</div>", html).group(1)
        shown = [int(x) for x in re.findall(r"= (\d+)%", legend)]
        assert abs(sum(shown) - 100) <= len(shown)  # rounding only
        head = html.split("<details class='gpunb-profile-rows'")[0]
        assert 1 <= len(big_numbers(p)) <= 3 and head.count("font-size:16px") == len(big_numbers(p))
        assert "<table" not in head  # the rows are one click away
        assert html.index("gpunb-time-bar") < html.index("gpunb-profile-rows")
