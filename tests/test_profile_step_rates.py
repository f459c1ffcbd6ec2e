"""One profile, one consistent account of its step times: each time per step names its statistic,
and each rate is said with the time it comes from.

The class closed: a rate and a time per step derived from different statistics shown side by side
unnamed (`--ops` printed "28.5 ms per step" (median), "5.7 steps/s" (1000 / the mean: 175 ms) and
"755 ms per step" (the profiler's own, slowed steps) in one report). Loops whose steps take
generated, uneven times (stalls make the mean far from the median) are profiled for real on the
CPU, with and without ``--ops``, and the report's numbers are read back and recomputed from the
step times the profile recorded.
"""

from __future__ import annotations

import random
import re
import statistics
import time

import pytest

torch = pytest.importorskip("torch")

import gpunb  # noqa: E402
from gpunb.views.profile_view import profile_text  # noqa: E402

_UNIT_MS = {"µs": 1e-3, "ms": 1.0, "s": 1000.0}
_TIME = r"([\d.,]+) (µs|ms|s)"


def _ms(number: str, unit: str) -> float:
    return float(number.replace(",", "")) * _UNIT_MS[unit]


def _shown_within(number: str, unit: str) -> float:
    """Half the last digit shown, in ms: a number printed as "3.8 ms" stands for 3.75-3.85 ms."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    return 0.5 * 10 ** -decimals * _UNIT_MS[unit] + 1e-9


def _steps_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("steps "))


@pytest.mark.parametrize("seed", range(4))
def test_each_time_per_step_names_its_statistic_and_each_rate_its_time(seed, tmp_path):
    rng = random.Random(seed)
    # mostly short steps, a few stalls: the mean lies well above the median
    pauses = [rng.choice([0.001, 0.002, 0.003, 0.003, 0.004, 0.03, 0.06]) for _ in range(14)]
    torch.manual_seed(seed)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 32)
    ops = seed % 2 == 0
    with gpunb.profile(record=False, show=False, ops=ops, trace_dir=tmp_path, flops=False) as p:
        for pause in pauses:
            time.sleep(pause)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = p.result
    st = r.steps
    steady = [t for i, t in enumerate(st.step_ms) if i >= st.skipped and i not in st.excluded]
    line = _steps_line(profile_text(r))

    median = re.search(rf"a median {_TIME} per step", line)
    mean = re.search(rf"a mean {_TIME} per step = ([\d.,]+) steps/s", line)
    assert median and mean, line
    assert _ms(*median.groups()) == pytest.approx(statistics.median(steady), abs=_shown_within(*median.groups()))
    assert _ms(*mean.groups()[:2]) == pytest.approx(statistics.fmean(steady), abs=_shown_within(*mean.groups()[:2]))
    rate = float(mean.group(3).replace(",", ""))
    assert rate * statistics.fmean(steady) / 1000 == pytest.approx(1.0, rel=0.02)  # the rate is of that mean
    # every time per step in the line is one of the named ones (no bare "N ms per step")
    for m in re.finditer(rf"{_TIME} per step", line):
        assert re.search(r"(median|mean) $", line[: m.start()]), f"unnamed time per step: {line}"
    if ops:
        ops_line = next(x for x in profile_text(r).splitlines() if x.strip().startswith("ops "))
        assert "per traced step, slowed by the profiler" in ops_line
        assert not re.search(rf"{_TIME} per step", ops_line)
