"""The sampler against the fake NVML replaying the recorded H200 trace."""

from __future__ import annotations

import itertools
import math
import os
import threading
import time

import pytest

from gpunb.analysis.monitor.sampler import (
    GPU_COLUMNS,
    HISTORY_TICKS,
    HZ_MAX,
    HZ_MIN,
    THREAD_NAME,
    RingColumns,
    Sampler,
    clamp_hz,
)
from gpunb.analysis.monitor.traffic import PCIE_COLUMNS
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.testing.fake_nvml import FakeGpu, FakePynvml

MIB = 2**20
TRACE = load_trace()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(name: str = "h200", **kw) -> tuple[Sampler, Clock, FakePynvml]:
    clock = Clock()
    fake = scenario(name, clock=clock)
    kw.setdefault("own_pids", [TRACE["pid"]])  # the recorded training process
    return Sampler(NvmlSession(fake), clock=clock, **kw), clock, fake


def run_ticks(sampler: Sampler, clock: Clock, n: int, dt: float = 0.25) -> None:
    for _ in range(n):
        sampler.tick()
        clock.t += dt


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_series_replay_the_recorded_trace_tick_by_tick():
    sampler, clock, fake = make(process_refresh_s=0.0)
    times = []
    for _ in range(int(TRACE["samples"][-1]["t"] / 0.25)):
        times.append(clock.t)
        sampler.tick()
        clock.t += 0.25
    cols = sampler.samples()
    assert cols["t_s"] == pytest.approx(times)
    gpu = fake.gpus[0]
    reserved = TRACE["facts"]["memory_reserved"]
    for i, t in enumerate(times):
        rec = gpu.sample_at(t)
        assert cols["gpu0_util_pct"][i] == rec["util_gpu"]
        assert cols["gpu0_mem_util_pct"][i] == rec["util_memory"]
        assert cols["gpu0_temp_c"][i] == rec["temp_c"]
        assert cols["gpu0_sm_clock_mhz"][i] == rec["sm_clock_mhz"]
        assert cols["gpu0_clock_events"][i] == rec["clocks_event_reasons"]
        assert cols["gpu0_power_w"][i] == pytest.approx(rec["power_mw"] / 1000, rel=1e-6)
        assert cols["gpu0_mem_used_mib"][i] == pytest.approx(rec["memory_used"] / MIB)
        free = TRACE["facts"]["memory_total"] - reserved - rec["memory_used"]
        assert cols["gpu0_mem_free_mib"][i] == pytest.approx(free / MIB)
        own = sum(p["used_gpu_memory"] for p in rec["processes"]) / MIB
        assert cols["gpu0_mem_own_mib"][i] == pytest.approx(min(own, rec["memory_used"] / MIB))
        assert cols["gpu0_mem_other_mib"][i] == pytest.approx(
            cols["gpu0_mem_used_mib"][i] - cols["gpu0_mem_own_mib"][i]
        )
    # The recorded story is in the series: the training ramp, full load, the OOM spike.
    used = cols["gpu0_mem_used_mib"]
    assert used[0] == 0 and max(used) > 120_000
    assert max(cols["gpu0_util_pct"]) >= 99
    assert any(e & 0x4 for e in cols["gpu0_clock_events"])  # power cap while training
    assert sampler.notes == type(sampler.notes)()  # a healthy GPU leaves no note


def test_another_process_memory_counts_as_other_not_this_kernel():
    sampler, clock, _ = make(own_pids=[os.getpid()], process_refresh_s=0.0)
    clock.t = 20.0  # training phase: the recorded process (not us) holds ~9.5 GiB
    sampler.tick()
    cols = sampler.samples()
    assert cols["gpu0_mem_own_mib"] == [0.0]
    assert cols["gpu0_mem_other_mib"][0] == pytest.approx(cols["gpu0_mem_used_mib"][0])
    assert cols["gpu0_mem_other_mib"][0] > 9000


def test_between_process_lists_memory_changes_count_as_this_kernels():
    # The recorded training process is "us"; the process list is read every 5 s only.
    sampler, clock, fake = make(process_refresh_s=5.0)
    fake.gpus[0].extra_processes.append({"pid": 999_001, "used_gpu_memory": 40 * 2**30})
    run_ticks(sampler, clock, 104, dt=0.25)  # through model build, training and the OOM spike
    cols = sampler.samples()
    rows = zip(cols["t_s"], cols["gpu0_mem_used_mib"], cols["gpu0_mem_own_mib"], cols["gpu0_mem_other_mib"])
    for _, used, own, other in rows:
        assert other == pytest.approx(40 * 1024, abs=16)  # the other user's 40 GiB, always
        assert own == pytest.approx(used - 40 * 1024, abs=16)
    assert max(cols["gpu0_mem_own_mib"]) > 120_000  # the OOM spike is ours, not "other"


def test_process_list_is_read_rarely():
    clock = Clock()
    steady = [s for s in TRACE["samples"] if s["phase"] == "idle-end"]  # memory does not move
    fake = FakePynvml([FakeGpu(facts=dict(TRACE["facts"]), samples=steady)], clock=clock)
    sampler = Sampler(NvmlSession(fake), clock=clock, process_refresh_s=5.0)
    run_ticks(sampler, clock, 40, dt=0.5)  # 20 s at 2 Hz
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 4
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 40


def test_a_memory_jump_brings_the_process_list_forward():
    sampler, clock, fake = make(process_refresh_s=5.0)
    clock.t = 5.0  # just before the recorded process creates its context (~6 s)
    run_ticks(sampler, clock, 6, dt=0.5)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 2  # at 5.0 s and at the jump
    assert sampler.samples()["gpu0_mem_own_mib"][-1] > 2000


def test_buffers_are_bounded_and_keep_the_newest_rows_in_order():
    sampler, clock, _ = make(capacity=50)
    run_ticks(sampler, clock, 203, dt=0.5)
    cols = sampler.samples()
    assert len(cols["t_s"]) == 50
    assert cols["t_s"] == pytest.approx([0.5 * i for i in range(153, 203)])
    assert sampler.buffer_bytes == 50 * sampler.bytes_per_tick
    assert sampler.ticks == 203
    # A window selects by time: the last 10 s at 2 Hz is 21 rows.
    assert len(sampler.window(10).t_s) == 21


def test_a_day_at_the_default_rate_fits_in_a_few_mb():
    sampler, _, _ = make()
    assert HISTORY_TICKS == 24 * 3600 * 2
    assert sampler.capacity == HISTORY_TICKS
    assert sampler.bytes_per_tick * HISTORY_TICKS < 9 * MIB  # one GPU: ~8.5 MB with the PCIe columns
    two, _, _ = make("two-gpus")
    assert two.bytes_per_tick - sampler.bytes_per_tick == sum(
        {"f": 4, "B": 1, "H": 2, "I": 4}[code] for _, code in GPU_COLUMNS + PCIE_COLUMNS
    )


def test_ring_columns_gaps_and_wraparound():
    ring = RingColumns([("a", "f"), ("b", "B")], capacity=3)
    for i in range(5):
        ring.append({"a": None if i == 3 else i * 1.5, "b": None if i == 4 else i})
    assert ring.tail() == {"a": [3.0, None, 6.0], "b": [2, 3, None]}
    assert ring.tail(2) == {"a": [None, 6.0], "b": [3, None]}
    assert ring.tail(0) == {"a": [], "b": []}
    ring.append({"b": 999})  # out of range: a gap (a clamped 254 would be a number nobody read)
    assert ring.tail(1)["b"] == [None]


@pytest.mark.parametrize("name", ["power-not-supported"])
def test_unsupported_power_is_a_gap_with_one_note(name):
    sampler, clock, _ = make(name)
    run_ticks(sampler, clock, 60)
    cols = sampler.samples()
    assert cols["gpu0_power_w"] == [None] * 60
    assert all(v is not None for v in cols["gpu0_util_pct"])
    notes = [n for n in sampler.notes if "power" in n]
    assert len(notes) == 1 and "not supported" in notes[0]
    assert sampler.window(30).gpus[0].power_limit_w is None


def test_lost_gpu_becomes_gaps_and_a_note_and_comes_back():
    clock = Clock()
    trace = load_trace()
    gpu = FakeGpu(facts=dict(trace["facts"]), samples=trace["samples"], lost_after_s=5.0)
    fake = FakePynvml([gpu], clock=clock)
    sampler = Sampler(NvmlSession(fake), clock=clock, own_pids=[trace["pid"]])
    run_ticks(sampler, clock, 40)  # 10 s: lost half way
    cols = sampler.samples()
    assert all(v is not None for v in cols["gpu0_mem_used_mib"][:20])
    for name, _ in GPU_COLUMNS:
        assert cols[f"gpu0_{name}"][20:] == [None] * 20
    assert any("lost" in n and "nvidia-smi" in n for n in sampler.notes)
    assert len(sampler.notes) == 1
    assert sampler.window(30).gpus[0].lost
    gpu.lost_after_s = None  # (a reset brought it back)
    sampler.tick()
    assert sampler.samples()["gpu0_util_pct"][-1] is not None
    assert "GPU 0 is back" in sampler.notes[-1]


def test_lost_gpu_never_kills_the_thread():
    sampler, _, _ = make("gpu-lost", hz=HZ_MAX)
    sampler._clock = time.monotonic  # real time for the thread
    sampler.start()
    try:
        time.sleep(0.6)
        assert sampler.running and sampler.ticks >= 3
    finally:
        sampler.stop()
    assert sampler.samples()["gpu0_util_pct"][-1] is None


def test_no_driver_samples_the_host_only():
    sampler, clock, _ = make("no-driver")
    run_ticks(sampler, clock, 3)
    cols = sampler.samples()
    assert not sampler.status.ok and "libnvidia-ml" in sampler.status.cause
    assert sorted(cols) == ["cpu_pct", "kernel_rss_mib", "ram_used_mib", "t_s"]
    assert cols["ram_used_mib"][-1] > 0 and cols["kernel_rss_mib"][-1] > 0


def test_first_host_cpu_reading_of_a_thread_is_a_gap():
    sampler, clock, _ = make()
    run_ticks(sampler, clock, 3)
    cpu = sampler.samples()["cpu_pct"]
    assert cpu[0] is None and all(0 <= v <= 100 for v in cpu[1:])


def test_listeners_are_called_and_a_failing_one_is_noted_once():
    sampler, clock, _ = make()
    seen = []
    sampler.add_listener(lambda s: seen.append(s.ticks))

    def broken(_s):
        raise RuntimeError("view gone")

    sampler.add_listener(broken)
    run_ticks(sampler, clock, 5)
    assert seen == [1, 2, 3, 4, 5]
    assert sum("view gone" in n for n in sampler.notes) == 1


def test_start_stop_restart_uses_a_fresh_thread_each_time():
    sampler, _, _ = make(hz=HZ_MAX)
    sampler._clock = time.monotonic
    sampler.start()
    first = sampler._thread
    sampler.start()  # already running: no second thread
    assert sampler._thread is first and len(sampler_threads()) == 1
    time.sleep(0.35)
    sampler.stop()
    sampler.stop()  # idempotent
    assert not first.is_alive() and not sampler.running and sampler_threads() == []
    ticks = sampler.ticks
    assert ticks >= 2
    sampler.start()
    second = sampler._thread
    assert second is not first
    time.sleep(0.35)
    sampler.stop()
    assert sampler.ticks > ticks and sampler_threads() == []
    assert 0 < sampler.thread_cpu_s < sampler.thread_wall_s


def test_rate_is_clamped_with_a_reason():
    assert clamp_hz(2) == (2.0, "")
    hz, why = clamp_hz(50)
    assert hz == HZ_MAX and "200 ms" in why
    hz, why = clamp_hz(0.1)
    assert hz == HZ_MIN and "minimum" in why
    for bad in (0, -1, "fast", float("nan"), True):
        with pytest.raises(ValueError):
            clamp_hz(bad)


def test_thread_rate_follows_hz():
    sampler, _, _ = make(hz=10)
    sampler._clock = time.monotonic
    sampler.start()
    time.sleep(1.05)
    sampler.stop()
    assert 9 <= sampler.ticks <= 13
    t = sampler.samples()["t_s"]
    gaps = [b - a for a, b in itertools.pairwise(t)]
    assert math.isclose(sorted(gaps)[len(gaps) // 2], 0.1, abs_tol=0.03)


def test_the_thread_never_prints_even_when_things_fail(capfd):
    sampler, _, _ = make("gpu-lost", hz=HZ_MAX)
    sampler._clock = time.monotonic

    def broken(_s):
        raise RuntimeError("widget gone")

    sampler.add_listener(broken)
    sampler.start()
    time.sleep(0.4)
    sampler.stop()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert sampler.ticks >= 3 and any("widget gone" in n for n in sampler.notes)


def test_no_driver_is_said_once_by_the_status_not_by_a_growing_retry_log(monkeypatch):
    import gpunb.analysis.monitor.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "REDISCOVER_S", (0.0, 0.0))  # look again at every tick
    sampler, clock, _ = make("no-driver")
    run_ticks(sampler, clock, 6)
    assert "libnvidia-ml" in sampler.status.cause  # the one place the view reads the cause from
    assert not [n for n in sampler.notes if "libnvidia-ml" in n or "again" in n]


def test_static_facts_missing_at_the_first_read_are_read_again_without_a_reload():
    clock = Clock()
    fake = scenario("h200", clock=clock)
    fake.transient["nvmlDeviceGetName"] = [999]  # NVML_ERROR_UNKNOWN once: the name is missing at first
    fake.transient["nvmlDeviceGetEnforcedPowerLimit"] = [999, 999]  # twice: read again after the backoff
    sampler = Sampler(NvmlSession(fake), clock=clock, own_pids=[TRACE["pid"]])
    first = sampler.gpu_series()[0]
    assert first.name == "GPU 0" and first.power_limit_w is None
    layout = sampler.layout
    run_ticks(sampler, clock, 12)  # 3 s: the first re-read (after 2 s) gets the name, not the limit
    series = sampler.gpu_series()[0]
    assert "H200" in series.name and series.power_limit_w is None and sampler.layout > layout
    run_ticks(sampler, clock, 16)  # 4 s more: the second re-read (after 4 s more) gets the limit
    assert sampler.gpu_series()[0].power_limit_w is not None
    calls = fake.calls.get("nvmlDeviceGetName", 0)
    run_ticks(sampler, clock, 400)  # everything known now: never asked again
    assert fake.calls.get("nvmlDeviceGetName", 0) == calls
