"""The monitor's energy since it started and its PCIe/NVLink charts, against the fake NVML replaying
the H200's recorded energy counter and PCIe throughput (``h200_energy_links.json``) and the H200
pair's recorded NVLink links (``h200x2_nvlink.json``)."""

from __future__ import annotations

import itertools
import json

import pytest
from IPython.utils.capture import capture_output

from gpunb.analysis.energy.tariff import Tariff, set_session_tariff
from gpunb.analysis.monitor.sampler import Sampler
from gpunb.analysis.monitor.traffic import PCIE_READS_PER_S, EnergyTally, PcieTurns
from gpunb.readings import peak_cache
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.testing.fake_nvml import FakeGpu, FakePynvml
from gpunb.views.monitor_layout import monitor_html, monitor_text
from tests.chart_html import images

NVML_NOT_SUPPORTED, NVML_UNKNOWN = 3, 999
UUID = load_trace()["facts"]["uuid"]


def charts(page: str) -> list[dict]:
    return images(page, "gpunb-chart")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(name_or_fake, seconds: float = 10.0, hz: float = 2.0, **kw):
    clock = Clock()
    fake = scenario(name_or_fake, clock=clock) if isinstance(name_or_fake, str) else name_or_fake
    if not isinstance(name_or_fake, str):
        fake.clock = clock
    sampler = Sampler(NvmlSession(fake), clock=clock, hz=hz, **kw)
    for _ in range(int(seconds * hz)):
        sampler.tick()
        clock.t += 1 / hz
    return sampler, clock, fake


@pytest.fixture(autouse=True)
def no_tariff():
    set_session_tariff(Tariff())  # the developer's environment names no price here
    yield
    set_session_tariff(None)


def test_pcie_charts_and_energy_line_appear_with_the_recorded_copy_traffic():
    sampler, _, _ = run("h200", seconds=8.0)  # the recording's pinned copies run from 4.5 s to 6.6 s
    rx = [v for v in sampler.samples()["gpu0_pcie_rx_gbs"] if v is not None]
    tx = [v for v in sampler.samples()["gpu0_pcie_tx_gbs"] if v is not None]
    assert max(rx) > 55 and max(tx) > 40 and min(rx) < 0.01  # 58.9 GB/s recorded; idle before
    page = monitor_html(sampler.window(30))
    assert "PCIe host→GPU (GB/s)" in page and "PCIe GPU→host (GB/s)" in page and "Host and links" in page
    assert len(charts(page)) == 5 + 2 + 2 and "NVLink" not in page  # one H200 alone: no NVLink chart
    alt = next(c["alt"] for c in charts(page) if c["alt"].startswith("PCIe host to GPU"))
    assert "GPU 0" in alt and "GB/s" in alt and "datasheet peak" in alt and "gen5 x16" in alt
    assert 'class="gpunb-energy"' in page and "Energy" in page and " Wh since " in page
    text = monitor_text(sampler.window(30))
    assert "PCIe in" in text and "GB/s" in text and "Energy: " in text and "NVLink" not in text


def test_energy_since_the_start_is_the_counters_difference():
    sampler, clock, fake = run("h200", seconds=20.0)
    first = fake.gpus[0].energy_at(0.0)[0]
    last = fake.gpus[0].energy_at(clock.t - 0.5)[0]  # the last tick's reading
    energy = sampler.traffic.energy(0)
    assert energy is not None and energy.source == "energy counter"
    assert energy.joules == pytest.approx((last - first) / 1000.0)
    assert energy.until_s - energy.since_s == pytest.approx(19.5)
    assert "estimated" not in monitor_text(sampler.window(30))


def test_without_a_counter_the_power_readings_are_integrated_and_the_figure_says_so():
    trace = load_trace()
    fake = FakePynvml([FakeGpu(facts=dict(trace["facts"]), samples=trace["samples"])])  # no energy recording
    sampler, _, _ = run(fake, seconds=10.0)
    energy = sampler.traffic.energy(0)
    assert energy is not None and energy.estimated and energy.joules > 0
    assert "estimated from the power readings" in monitor_text(sampler.window(30))
    assert not any("energy counter" in n for n in sampler.notes)  # never had one: the line says it, no note


def test_the_price_and_carbon_show_only_when_the_user_named_them():
    sampler, _, _ = run("h200", seconds=4.0)
    assert "€" not in monitor_text(sampler.window(30)) and "CO₂" not in monitor_text(sampler.window(30))
    set_session_tariff(Tariff(0.25, "€", 350.0))
    text = monitor_text(sampler.window(30))
    page = monitor_html(sampler.window(30))
    assert "€0.0" in text and "g CO₂" in text and "€0.0" in page and "g CO₂" in page


def test_limit_lines_are_the_measured_copy_bandwidth_else_the_datasheet(private_peak_cache):
    sampler, _, _ = run("h200", seconds=3.0)
    limits = sampler.window(30).gpus[0].links
    assert limits is not None and not limits.pcie_rx.measured and limits.pcie_rx.gbs == pytest.approx(63.0, abs=0.1)
    assert "datasheet peak" in monitor_html(sampler.window(30))

    # %gpucheck measured the copies (its probe's copy step): the next monitor draws those
    peak_cache.remember(UUID, "NVIDIA H200", {}, copy={"pinned_gbps": 53.1, "pinned_d2h_gbps": 54.4})
    assert peak_cache.lookup(UUID).copy_gbps == {"h2d": 53.1, "d2h": 54.4}
    peak_cache.forget_this_process()  # read back from the file, as a later kernel would
    sampler, _, _ = run("h200", seconds=3.0)
    limits = sampler.window(30).gpus[0].links
    assert limits.pcie_rx.measured and limits.pcie_rx.gbs == 53.1 and limits.pcie_tx.gbs == 54.4
    page = monitor_html(sampler.window(30))
    assert "measured peak" in page and "%gpucheck" in page


def test_a_cache_entry_with_garbage_copy_figures_is_ignored(private_peak_cache):
    private_peak_cache.parent.mkdir(parents=True, exist_ok=True)
    entry = {"name": "x", "tflops": {}, "copy_gbps": {"h2d": "fast"}, "measured_at": "", "pid": 1}
    private_peak_cache.write_text(json.dumps({UUID: entry}))
    assert peak_cache.lookup(UUID) is None
    sampler, _, _ = run("h200", seconds=2.0)
    assert not sampler.window(30).gpus[0].links.pcie_rx.measured


def test_nvlink_chart_from_the_per_link_counters_of_the_h200_pair():
    clock = Clock()
    fake = scenario("h200x2-nvlink", clock=clock)
    sampler = Sampler(NvmlSession(fake), clock=clock, hz=2.0)
    kib = 0
    for _ in range(20):
        sampler.tick()
        clock.t += 0.5
        kib += 1_000_000  # each link receives 1 GB (in KiB) every half second
        for gpu in fake.gpus:
            gpu.fields["139"]["value"] = kib  # the fake gives a field's value for every link (scope)
    rx = [v for v in sampler.samples()["gpu0_nvlink_rx_gbs"] if v is not None]
    # 18 active links, summed: 18 x 1e6 KiB x 1024 per 0.5 s
    assert rx and rx[-1] == pytest.approx(18 * 1e6 * 1024 / 0.5 / 1e9, rel=1e-3)
    window = sampler.window(30)
    assert window.gpus[0].links.nvlink_links == 18
    assert window.gpus[0].links.nvlink.gbs == pytest.approx(18 * 26.562, rel=1e-3)
    page = monitor_html(window)
    assert "NVLink received (GB/s)" in page and len(charts(page)) == 5 + 2 * 5 + 2 + 3  # overview, GPUs, host
    alt = next(c["alt"] for c in charts(page) if c["alt"].startswith("NVLink received"))
    assert "GPU 0 " in alt and "GPU 1 " in alt and "18 links" in alt
    assert "NVLink in" in monitor_text(window)


def test_nvlink_is_hidden_where_its_counters_are_not_supported():
    sampler, _, _ = run("pcie-pair", seconds=3.0)  # no NVLink at all
    assert "NVLink" not in monitor_html(sampler.window(30))
    clock = Clock()
    fake = scenario("h200x2-nvlink", clock=clock)
    for gpu in fake.gpus:  # links up, but the driver does not count their traffic (the H200 without peers)
        gpu.fields["138"] = gpu.fields["139"] = {"nvml_return": NVML_NOT_SUPPORTED}
    sampler, _, _ = run(fake, seconds=3.0)
    page = monitor_html(sampler.window(30))
    assert "NVLink" not in page and "gpu0_nvlink_rx_gbs" not in sampler.samples()
    assert len(charts(page)) == 5 + 2 * 5 + 2 + 2  # no chart of zeros


def test_nvml_errors_mid_run_leave_a_note_and_a_gap_never_a_crash():
    sampler, clock, fake = run("h200", seconds=3.0)
    gpu = fake.gpus[0]
    before = sampler.traffic.energy(0).joules
    gpu.faults["nvmlDeviceGetTotalEnergyConsumption"] = NVML_UNKNOWN
    gpu.faults["nvmlDeviceGetPcieThroughput"] = NVML_UNKNOWN
    for _ in range(6):
        sampler.tick()
        clock.t += 0.5
    notes = " ".join(sampler.notes)
    assert "GPU 0 energy counter" in notes and "counts to the last reading" in notes
    assert "GPU 0 PCIe throughput" in notes and "shown as a gap" in notes
    assert sampler.samples()["gpu0_pcie_rx_gbs"][-4:] == [None] * 4
    assert sampler.traffic.energy(0).joules == before  # held, not guessed
    html_while = monitor_html(sampler.window(30))
    assert "Energy" in html_while
    del gpu.faults["nvmlDeviceGetTotalEnergyConsumption"], gpu.faults["nvmlDeviceGetPcieThroughput"]
    for _ in range(4):
        sampler.tick()
        clock.t += 0.5
    notes = " ".join(sampler.notes)
    assert "energy counter readings are back" in notes and "PCIe throughput readings are back" in notes
    assert sampler.traffic.energy(0).joules > before  # the counter's difference covers the gap
    assert sum(1 for n in sampler.notes if "energy counter:" in n) == 1  # noted once, not every tick


def test_a_gpu_lost_mid_run_keeps_its_energy_so_far_and_the_monitor_goes_on():
    sampler, clock, fake = run("two-gpus", seconds=3.0)
    before = sampler.traffic.energy(1).joules
    fake.gpus[1].lost_after_s = clock.t
    for _ in range(6):
        sampler.tick()
        clock.t += 0.5
    window = sampler.window(30)
    assert window.gpus[1].lost and sampler.traffic.energy(1).joules == before
    assert sampler.traffic.energy(0).joules > 0
    page = monitor_html(window)
    assert "lost (no readings)" in page and "Energy" in page and "PCIe host→GPU" in page
    assert monitor_text(window).count("Energy: ") == 1


def test_a_driver_reload_that_resets_the_counter_is_carried_over():
    tally = EnergyTally()
    tally.add(0, 0.0, 5_000_000, 100.0)
    tally.add(0, 1.0, 5_400_000, 400.0)  # 400 J
    tally.add(0, 2.0, 1_000, 400.0)  # reloaded: starts again near 0
    tally.add(0, 3.0, 301_000, 300.0)  # 300 J more
    assert tally.so_far(0).joules == pytest.approx(700.0)


def test_pcie_reads_take_turns_so_eight_gpus_never_pile_up_in_one_tick():
    turns = PcieTurns()
    gpus = list(range(8))
    seen: dict[int, list[int]] = {i: [] for i in gpus}
    for tick in range(40):  # 20 s at 2 Hz
        due = turns.due(gpus, 2.0)
        assert len(due) <= PCIE_READS_PER_S / 2.0 + 1  # at most 3 x 40 ms of the worker per tick
        for i in due:
            seen[i].append(tick)
    for ticks in seen.values():  # every GPU in turn, every ~1.6 s
        assert max(b - a for a, b in itertools.pairwise(ticks)) <= 4
    one = PcieTurns()
    assert all(one.due([0], 2.0) == {0} for _ in range(10))  # one GPU at 2 Hz: every tick
    assert sum(len(one.due([0], 10.0)) for _ in range(10)) == 5  # at 10 Hz: 5 a second


def test_the_overhead_benchmarks_off_switch_reads_nothing_new():
    sampler, _, fake = run("h200", seconds=1.0, read_links=False)
    assert "nvmlDeviceGetPcieThroughput" not in fake.calls and "nvmlDeviceGetTotalEnergyConsumption" not in fake.calls
    assert sampler.window(30).gpus[0].links is None and "PCIe" not in monitor_html(sampler.window(30))


def test_a_saved_live_monitor_keeps_the_energy_and_link_charts(ip, fake_nvml, monkeypatch):
    import gpunb
    from gpunb.shells.kernel_state import STANDALONE_STATE
    from gpunb.shells.monitor import stop_all
    from gpunb.shells.save_hook import drop_live_controls

    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(ip, "kernel", object(), raising=False)  # a Jupyter kernel: controls are shown
    try:
        mon = gpunb.monitor(hz=10, frontend="live")
        with capture_output() as out:
            mon._ipython_display_()
        controls, frame = (o for o in out.outputs)
        saved = [{"output_type": "display_data", "data": dict(o.data), "metadata": dict(o.metadata)}
                 for o in (controls, frame)]
        model = {"type": "notebook", "content": {"cells": [{"cell_type": "code", "outputs": saved}]}}
        drop_live_controls(model=model, path="a.ipynb", contents_manager=None)
        kept = model["content"]["cells"][0]["outputs"]
        assert len(kept) == 1 and "PCIe host→GPU (GB/s)" in kept[0]["data"]["text/html"]
        assert 'class="gpunb-energy"' in kept[0]["data"]["text/html"]
        mon.stop()
    finally:
        stop_all(STANDALONE_STATE)
        STANDALONE_STATE.sampler = None
