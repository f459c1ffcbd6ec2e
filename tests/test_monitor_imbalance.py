"""%gpumonitor flags unbalanced GPUs, judged over a window of readings, never one tick.

Two GPUs replay the H200 readings recorded while a model trained (phase "train": 96-100 %
busy, the training process holding 9 GiB) and while it was built (phase "model": idle, 2 GiB
held). Pairing those phases gives one GPU working while the other idles; the memory case lowers
one GPU's held memory in the training rows (made from the recording, said so where done).
"""

from __future__ import annotations

import copy
import re

import pytest

from gpunb.analysis.monitor.imbalance import find_imbalance
from gpunb.analysis.monitor.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace
from gpunb.testing.fake_nvml import FakeGpu, FakePynvml, load_nvlink_pair
from gpunb.views.imbalance_view import imbalance_badge, imbalance_html, imbalance_text

TRACE = load_trace()
PID = TRACE["pid"]  # the recorded training process; the sampler is told it is this kernel's


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def phase(name: str) -> list[dict]:
    rows = [r for r in TRACE["samples"] if r["phase"] == name and r["processes"]]
    assert rows, name
    return [{**r, "t": 0.5 * i} for i, r in enumerate(rows * 20)]  # long enough to replay for a minute


def sampler_for(*gpu_rows: list[dict], own: bool = True) -> tuple[Sampler, Clock]:
    clock = Clock()
    recorded = load_nvlink_pair()["gpus"]
    gpus = [FakeGpu(facts={**TRACE["facts"], **recorded[i % 2]["facts"]}, samples=rows)
            for i, rows in enumerate(gpu_rows)]
    fake = FakePynvml(gpus, clock=clock)
    return Sampler(NvmlSession(fake), clock=clock, own_pids=[PID] if own else [1], process_refresh_s=1.0), clock


def run(sampler: Sampler, clock: Clock, seconds: float, hz: float = 2.0) -> None:
    for _ in range(int(seconds * hz)):
        sampler.tick()
        clock.t += 1 / hz


def test_two_gpus_training_alike_are_balanced():
    sampler, clock = sampler_for(phase("train"), phase("train"))
    run(sampler, clock, 40)
    assert sampler.imbalance() == []


def test_one_gpu_idle_while_the_other_works_is_flagged_after_a_window():
    sampler, clock = sampler_for(phase("train"), phase("model"))
    run(sampler, clock, 5)
    assert sampler.imbalance() == []  # 5 s of readings: too soon to judge
    run(sampler, clock, 30)
    (finding,) = [f for f in sampler.imbalance() if f.kind == "idle"]
    assert finding.gpus == (1,)
    # GPU 0's recorded ramp has a few readings under 50 %: those moments do not count as "worked"
    assert re.fullmatch(r"GPU 1 idle 9\d% of the last 30 s while GPU 0 worked "
                        r"\(median utilization GPU 0 99%, GPU 1 0%\)", finding.text), finding.text
    assert finding.detail["whose"] == "this kernel's processes"


def test_a_short_pause_is_not_an_imbalance():
    """The window decides: GPU 1 idles 5 s of 30 s (a checkpoint save, an evaluation)."""
    train = phase("train")
    paused = [dict(r) for r in train]
    for r in paused[20:30]:
        r.update(util_gpu=0)
    sampler, clock = sampler_for(train, paused)
    run(sampler, clock, 30)
    assert [f.kind for f in sampler.imbalance()] == []


def test_one_gpu_holding_far_more_memory_is_flagged():
    train = phase("train")
    lighter = copy.deepcopy(train)
    for r in lighter:  # GPU 1's rank holds 3 GiB instead of ~9 (made from the recording)
        r["memory_used"] = 3 * 2**30
        for p in r["processes"]:
            p["used_gpu_memory"] = 3 * 2**30
    sampler, clock = sampler_for(train, lighter)
    run(sampler, clock, 30)
    (finding,) = sampler.imbalance()
    assert finding.kind == "memory" and finding.gpus == (0,)
    assert "GPU 0 holds 2.9x GPU 1's memory (8.8 vs 3.0 GiB" in finding.text


def test_gpus_this_kernel_does_not_use_are_not_judged():
    """Someone else trains on GPU 0 and GPU 1 is free: not this notebook's imbalance."""
    sampler, clock = sampler_for(phase("train"), phase("model"), own=False)
    run(sampler, clock, 35)
    assert sampler.imbalance() == []


def test_one_gpu_is_never_unbalanced():
    sampler, clock = sampler_for(phase("train"))
    run(sampler, clock, 35)
    assert sampler.imbalance() == []


def test_without_ownership_gpus_in_use_stand_in_and_the_finding_says_so():
    t = [0.5 * i for i in range(60)]

    class Series:
        def __init__(self, index, util, used):
            self.index = index
            self.columns = {"util_pct": [util] * 60, "mem_used_mib": [used] * 60, "mem_own_mib": [None] * 60}

    findings = find_imbalance(t, [Series(0, 98, 9000.0), Series(1, 0, 9000.0), Series(2, 0, 300.0)])
    (idle,) = findings
    assert idle.gpus == (1,) and "NVML cannot say whose" in idle.detail["whose"]


def test_the_monitor_shows_the_finding_as_a_line(monkeypatch):
    from gpunb.shells.kernel_state import KernelState
    from gpunb.shells.monitor import Monitor

    sampler, clock = sampler_for(phase("train"), phase("model"))
    run(sampler, clock, 35)
    m = Monitor(sampler, KernelState(), window_s=60, devices=None, live=False)
    assert m.text().splitlines()[0].startswith("unbalanced GPUs (idle GPU): GPU 1 idle 9")
    assert "ran out of batches" in m.text().splitlines()[0]
    html = m.html()
    # one line above the charts, inside the monitor's frame ...
    assert html.startswith('<div class="gpunb-monitor"') and "idle GPU" in html
    assert html.index('class="gpunb-imbalance"') < html.index('class="gpunb-gpu"')
    # ... and a badge in the heading of the GPU it names (monitor_layout.gpu_heading), not in the other's
    rows = html.split('<div class="gpunb-gpu"')[1:]
    assert len(rows) == 2 and "unbalanced: idle" not in rows[0] and "unbalanced: idle" in rows[1]
    assert m.to_dict()["imbalance"][0]["gpus"] == [1]
    # the live frame the sampler thread redraws says the same
    bundle = m._live_bundle()
    assert "gpunb-imbalance" in bundle["text/html"] and "unbalanced: idle" in bundle["text/html"]
    assert bundle["text/plain"].startswith("unbalanced GPUs (idle GPU)")


def test_the_line_escapes_what_it_shows():
    class F:
        kind, text = "idle", "<img src=x onerror=alert(1)>"

    out = imbalance_html([F()])
    assert "<img" not in out and "&lt;img" in out
    badge = imbalance_badge([type("G", (F,), {"gpus": (1,)})()], 1)
    assert "<img" not in badge and "&lt;img" in badge and imbalance_badge([], 1) == ""
    assert imbalance_text([]) == [] and imbalance_html([]) == ""


@pytest.mark.parametrize("seconds", [29, 60])
def test_only_the_window_counts(seconds):
    """An idle stretch that ended more than the window ago is forgotten."""
    train, build = phase("train"), phase("model")
    second = build[: 2 * seconds] + [{**r, "t": r["t"] + seconds} for r in train]
    sampler, clock = sampler_for(train, second)
    run(sampler, clock, seconds + 32)
    assert [f.kind for f in sampler.imbalance()] == []
