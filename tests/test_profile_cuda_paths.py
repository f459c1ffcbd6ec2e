"""The CUDA branches of the profiler, exercised on a CPU machine.

``torch.cuda`` is replaced by a stand-in whose events are stamped with the host clock and
whose allocator counters come from the recorded H200 trace; everything else is the real
torch training on the CPU. This checks the plumbing (event read-back in batches, step 0
from the cell's start event, peak reset, NVML reconciliation); the real GPU numbers are
checked in tests/gpu/test_profile_gpu.py.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

import gpunb  # noqa: E402
from gpunb.analysis.steps.events import READ_BACK_EVERY  # noqa: E402
from gpunb.readings import nvml as nvml_module  # noqa: E402
from gpunb.testing import load_trace  # noqa: E402
from gpunb.views.profile_view import fmt_bytes  # noqa: E402
from tests.simulated_cuda import HostClockEvent  # noqa: E402


def test_steps_from_events_read_back_in_batches(fake_cuda):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    HostClockEvent.made = 0
    with gpunb.profile(record=False) as p:
        time.sleep(0.5)  # setup before the first step belongs to step 0 (and NVML samples ~5 Hz)
        for _ in range(600):  # several read-back batches
            model(x).sum().backward()
            opt.step()
            time.sleep(0.0003)  # ~0.2 s of steps on any host: several MIN_GAP_S spans after the first read-back
    r = p.result
    # host-bound (stand-in events complete at once): after the first read-back, events at most
    # every MIN_GAP_S, and the steps between two events split their time by the host clock
    assert r.steps.count == 600 and r.steps.source.startswith("CUDA events every ~")
    # events are reused once read back: a bounded pool, not one per step (plus start and end)
    assert HostClockEvent.made <= READ_BACK_EVERY + 1 + 2
    assert len(r.steps.step_ms) == 600
    assert r.steps.first_ms >= 500
    # event i - event i-1 for every step: they add up to the host span from step 0 to the last
    span_ms = (r.step_marks_s[-1] - r.step_marks_s[0]) * 1000
    assert abs(sum(r.steps.step_ms[1:]) - span_ms) < 5
    assert fake_cuda.calls.count("reset_peak_memory_stats") == 1
    g = r.gpu
    assert g.name == "NVIDIA H200" and g.compute_capability == (9, 0)
    assert g.peak_allocated_bytes == 8931427840 and g.peak_reserved_bytes == 9216983040
    recorded = {q["used_gpu_memory"] for s in load_trace()["samples"] for q in s["processes"] if q["pid"] == 412}
    assert g.nvml_index == 0 and g.nvml_process_bytes in recorded and g.process_match == "pid"  # by UUID and PID
    assert g.other_processes_bytes == 0 and g.util_mean_pct > 95
    recorded_used = {s["memory_used"] for s in load_trace()["samples"]}
    reserved = load_trace()["facts"]["memory_reserved"]  # NVML v1 "used" includes the driver's reservation
    assert g.nvml_device_peak_bytes - reserved in recorded_used
    assert "NVML device peak" in str(r)
    text = str(r)
    assert f"NVML this process {fmt_bytes(g.nvml_process_bytes)} at cell end" in text
    assert "outside torch's cache" in text
    assert r.synced_wall_s is not None and r.gpu_time_s is not None
    assert r.memory_timeline and r.memory_timeline[0][2] == 9216983040  # (t, allocated, reserved)


def test_no_reset_keeps_the_counter_and_reports_no_cell_peak(fake_cuda):
    with gpunb.profile(record=False, reset_peak=False) as p:
        pass
    assert fake_cuda.calls.count("reset_peak_memory_stats") == 0
    assert p.result.gpu.peak_allocated_bytes is None  # not above the earlier peak
    assert "not above the earlier peak" in str(p.result)


def test_fp32_params_on_h200_get_bf16_advice(fake_cuda):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpunb.profile(record=False) as p:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    # parameters are really on the CPU here, and NVML sees an H200 with a CUDA build: on-cpu
    assert p.result.verdict.kind == "on-cpu"
    assert p.result.advice[0].title == "Move the model and each batch to the GPU"
    assert any("bf16" in a.title for a in p.result.advice)


def test_one_line_reads_util_samples_only_for_cells_nvml_can_describe(fake_cuda):
    from gpunb.analysis.profile.meter import UTIL_MIN_S, CellMeter

    calls = []
    session = nvml_module.default_session()
    original = session.query

    def counting(name, *args):
        calls.append(name)
        return original(name, *args)

    session.query = counting
    meter = CellMeter()
    meter.start()
    short = meter.stop()
    assert short.util_pct is None and "nvmlDeviceGetSamples" not in calls  # no end reading: too short
    assert short.energy_j is None
    assert short.peak_vram_bytes == fake_cuda.stats["allocated_bytes.all.peak"]
    meter.start()
    time.sleep(UTIL_MIN_S + 0.05)
    long = meter.stop()
    assert calls.count("nvmlDeviceGetSamples") == 1 and long.util_pct > 95
    assert long.energy_j is None  # a 2 s cell: no energy read at its end (ENERGY_MIN_S)
    assert calls.count("nvmlDeviceGetTotalEnergyConsumption") == 2  # the two cells' starts
    meter.start()
    time.sleep(UTIL_MIN_S + 0.05)
    meter.stop()
    assert calls.count("nvmlDeviceGetUUID") <= 1  # the GPU is matched once per meter, not per cell


def test_one_line_energy_is_the_counter_end_minus_start(fake_cuda, monkeypatch):
    from gpunb.analysis.profile import meter as meter_module

    monkeypatch.setattr(meter_module, "ENERGY_MIN_S", 0.5)
    monkeypatch.setattr(meter_module, "UTIL_MIN_S", 0.5)
    session = nvml_module.default_session()
    read = []
    original = session.query

    def recording(name, *args):
        value = original(name, *args)
        if name == "nvmlDeviceGetTotalEnergyConsumption":
            read.append(value)
        return value

    session.query = recording
    meter = meter_module.CellMeter()
    meter.start()
    time.sleep(0.6)
    line = meter.stop()
    assert len(read) == 2 and line.energy_j == (read[1] - read[0]) / 1000.0
    # the recorded H200's counter: a training GPU's hundreds of watts
    assert 50 < line.energy_j / line.synced_wall_s < 800


def test_one_line_shows_the_cells_energy_and_history_keeps_it():
    from gpunb.analysis.profile.meter import CellLine
    from gpunb.views.profile_view import HISTORY_HEADER, _history_row, one_line_text

    line = CellLine(wall_s=12.0, synced_wall_s=12.5, peak_vram_bytes=3 * 2**30, util_pct=97.0, peak_rss_bytes=None,
                    cell=5, energy_j=7200.0)
    assert one_line_text(line) == ("gpuprofile In [5]: 12.00 s (GPU done at 12.50 s) · peak VRAM 3.00 GiB · "
                                   "GPU util 97% · 2 Wh at 576 W")
    assert _history_row(0, line, None, None)[HISTORY_HEADER.index("energy")] == "2 Wh"
    no_counter = CellLine(12.0, 12.5, 3 * 2**30, 97.0, None, cell=5)
    assert "Wh" not in one_line_text(no_counter)
    assert _history_row(0, no_counter, None, None)[HISTORY_HEADER.index("energy")] == "-"
