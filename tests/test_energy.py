"""Energy of a profiled cell (issue 23) on the fake NVML, whose energy counter, power and PCIe
throughput replay the H200's recording (``gpunb/testing/h200_energy_links.json``)."""

from __future__ import annotations

import itertools
import time

import pytest

from gpunb.analysis.energy.meter import (
    COUNTER,
    ESTIMATE,
    MIN_WINDOW_S,
    CellEnergy,
    EnergyMeter,
    Mark,
    steady_step_joules,
    window_step_joules,
    window_step_seconds,
)
from gpunb.analysis.energy.tariff import Tariff, parse_carbon, parse_price, tariff_from_env
from gpunb.readings.energy import KB, PowerSamples, read_energy, read_pcie, read_power_since
from gpunb.readings.gpu_activity import now_us
from gpunb.readings.nvml import NvmlSession, is_available
from gpunb.testing.fake_nvml import load_energy_links, scenario


def _phase(name: str) -> dict:
    return next(p for p in load_energy_links()["phases"] if p["name"].startswith(name))


def _fake_at(t: dict):
    return scenario("h200", clock=lambda: t["t"])


def test_the_counter_is_read_as_recorded_and_never_runs_backwards_when_the_recording_loops():
    t = {"t": 0.0}
    nvml = NvmlSession(_fake_at(t))
    rows = load_energy_links()["samples"]
    seen = []
    for step in range(0, 400):
        t["t"] = step * 0.1  # 40 s: the 9 s recording four times over
        seen.append(read_energy(nvml, 0).energy_mj)
    assert seen[0] == rows[0]["energy_mj"]
    assert all(b >= a for a, b in itertools.pairwise(seen))
    assert seen[-1] - seen[0] > 3 * (rows[-1]["energy_mj"] - rows[0]["energy_mj"])


def test_pcie_throughput_during_the_recorded_host_to_device_copies_is_tens_of_gb_per_s():
    copy = _phase("pinned host->device")
    t = {"t": (copy["t0"] + copy["t1"]) / 2}
    got = read_pcie(NvmlSession(_fake_at(t)), 0)
    assert got.rx_bytes_s > 40e9 and got.rx_bytes_s % KB == 0  # host -> GPU
    idle = _phase("idle")
    t["t"] = (idle["t0"] + idle["t1"]) / 2
    assert read_pcie(NvmlSession(_fake_at(t)), 0).rx_bytes_s < 1e8


def test_a_gpu_without_the_counter_says_not_supported():
    fake = scenario("h200")
    fake.gpus[0].energy = None
    value = read_energy(NvmlSession(fake), 0).energy_mj
    assert not is_available(value) and "not supported" in str(value)


def test_power_samples_integrate_to_power_times_time():
    s = PowerSamples(((1_000_000, 100.0), (2_000_000, 300.0), (3_000_000, 300.0)))
    # 100 W held from the window's start (1.5 s) to 2.0 s, then 300 W to 3.5 s
    assert s.joules(1_500_000, 3_500_000) == pytest.approx(0.5 * 100 + 1.5 * 300)
    assert s.joules(5_000_000, 6_000_000) is None  # no reading inside: nothing to integrate


def test_the_fake_answers_power_samples_from_the_trace():
    got = read_power_since(NvmlSession(scenario("h200")), 0, now_us() - 30_000_000)
    assert isinstance(got, PowerSamples) and got.points
    assert all(0 < w < 1000 for _, w in got.points)


def test_the_steady_window_excludes_the_warm_up_and_divides_by_its_steps():
    marks = [Mark(0.1, 0, {0: 0}), Mark(0.5, 1, {0: 400_000}),  # warm-up: 400 J for one step
             Mark(1.0, 11, {0: 600_000}), Mark(2.0, 31, {0: 1_000_000})]
    joules, steps, seconds = steady_step_joules(marks, warmup_steps=1)
    assert (steps, seconds) == (30, 1.5)
    assert joules == pytest.approx(600.0 / 30)  # (1000 - 400) J over 30 steps


def test_a_window_shorter_than_a_second_gives_no_per_step_energy():
    marks = [Mark(0.0, 1, {0: 0}), Mark(MIN_WINDOW_S - 0.1, 20, {0: 500_000})]
    assert steady_step_joules(marks, warmup_steps=1)[0] is None


def test_the_meter_reads_a_cells_energy_from_the_counter_and_per_step_over_the_steady_window():
    matmul = _phase("bf16 matmul")
    t = {"t": matmul["t0"] + 0.1}
    nvml = NvmlSession(_fake_at(t))
    meter = EnergyMeter(nvml, [0], clock=lambda: t["t"])
    meter._start.result()
    for step in range(1, 41):  # 40 steps over 2.5 s of the recorded matmul burst
        t["t"] += 2.5 / 40
        meter.at_step(step)
        time.sleep(0.005)  # the worker answers in the background
    cell = meter.finish(warmup_steps=1, batch_size=64)
    assert cell is not None and cell.gpus[0].source == COUNTER
    rows = load_energy_links()["samples"]
    expected = _counter_at(rows, t["t"]) - _counter_at(rows, matmul["t0"] + 0.1)
    assert cell.joules == pytest.approx(expected / 1000)
    assert 400 < cell.average_w < 800  # the H200 near its 700 W limit
    assert cell.step_joules is not None and cell.window_s >= MIN_WINDOW_S
    assert cell.step_joules == pytest.approx(cell.joules / 40, rel=0.35)
    assert cell.sample_joules == pytest.approx(cell.step_joules / 64)


def _counter_at(rows: list[dict], t: float) -> int:
    return [r for r in rows if r["t"] <= t][-1]["energy_mj"]


def test_without_the_counter_the_meter_integrates_power_samples_and_says_it_is_an_estimate():
    fake = scenario("h200")
    fake.gpus[0].energy = None
    nvml = NvmlSession(fake)
    meter = EnergyMeter(nvml, [0])
    time.sleep(0.3)
    cell = meter.finish()
    assert cell is not None and cell.estimated and cell.gpus[0].source == ESTIMATE
    assert cell.joules > 0 and "power averages" in cell.note


def test_no_driver_gives_no_energy_and_no_error():
    meter = EnergyMeter(NvmlSession(scenario("no-driver")), [0])
    assert meter.finish() is None


@pytest.mark.parametrize("text, per_kwh, currency", [
    ("0.25/kWh", 0.25, ""), ("€0.25/kWh", 0.25, "€"), ("0.25 EUR/kWh", 0.25, "EUR"), ("$0.30 / kWh", 0.30, "$"),
    ("0.00025/Wh", 0.25, ""), ("120/MWh", 0.12, ""), ("0.25", 0.25, ""),
])
def test_a_price_is_read_per_kwh_with_the_users_currency(text, per_kwh, currency):
    assert parse_price(text) == (pytest.approx(per_kwh), currency)


@pytest.mark.parametrize("text, grams", [("350g/kWh", 350), ("0.35kg/kWh", 350), ("350 gCO2/kWh", 350),
                                         ("350", 350), ("350000 g/MWh", 350)])
def test_a_carbon_intensity_is_read_in_grams_per_kwh(text, grams):
    assert parse_carbon(text) == pytest.approx(grams)


@pytest.mark.parametrize("bad", ["cheap", "0.25/kW", "-1/kWh", "", "1e3/kWh"])
def test_a_price_that_is_not_one_is_refused_with_how_to_write_it(bad):
    with pytest.raises(ValueError, match=r"write it as 0\.25/kWh"):
        parse_price(bad)


def test_cost_and_co2_only_when_named():
    assert Tariff().cost(1000) is None and Tariff().co2_g(1000) is None and Tariff().empty
    t = Tariff(0.25, "€", 350)
    assert t.cost(70) == pytest.approx(0.0175) and t.cost_words(70) == "€0.02"
    assert t.cost_words(10) == "€0.0025" and t.co2_g(70) == pytest.approx(24.5)
    assert Tariff(0.25, "EUR").cost_words(1000) == "0.25 EUR"
    assert Tariff(0.25, "€").spent_words(10) == "€0.0025" and Tariff(0.25, "").spent_words(10) == "cost 0.0025"


def test_the_environment_names_the_tariff_and_a_bad_value_becomes_a_note():
    t, notes = tariff_from_env({"GPUNB_ENERGY_PRICE": "0.3/kWh", "GPUNB_CARBON_INTENSITY": "lots"})
    assert t.price_per_kwh == pytest.approx(0.3) and t.carbon_g_per_kwh is None
    assert len(notes) == 1 and "GPUNB_CARBON_INTENSITY" in notes[0]


def test_consecutive_windows_of_a_second_give_the_per_step_spread():
    marks = [Mark(0.0, 1, {0: 0})] + [Mark(0.5 * k, 1 + 10 * k, {0: 100_000 * k + (5_000 if k == 4 else 0)})
                                      for k in range(1, 9)]
    windows = window_step_joules(marks, warmup_steps=1)
    assert len(windows) == 4  # 4 s of marks every 0.5 s: four windows of 1 s
    assert windows[0] == pytest.approx(10.0) and windows[1] == pytest.approx(10.25)
    cell = CellEnergy((), 4.0, window_step_joules=windows, window_step_s=window_step_seconds(marks, warmup_steps=1))
    assert cell.step_spread == pytest.approx((10.25 - 9.75) / 10.0)
    assert cell.window_step_s == pytest.approx((0.05,) * 4) and cell.step_time_spread == pytest.approx(0.0)


def test_a_loop_that_slows_down_shows_its_time_spread_beside_the_energys():
    # steady 200 W; steps take 50 ms for 2 s, then 60 ms: the energy per step follows the time
    marks, t, steps = [], 0.0, 1
    for k in range(9):
        marks.append(Mark(t, steps, {0: round(200_000 * t)}))
        per = 0.05 if k < 4 else 0.06
        t, steps = t + 0.5, steps + round(0.5 / per)
    cell = CellEnergy((), t, window_step_joules=window_step_joules(marks, 1),
                      window_step_s=window_step_seconds(marks, 1))
    assert cell.step_spread == pytest.approx(cell.step_time_spread, rel=0.02) and cell.step_spread > 0.1


def test_the_parts_of_a_total_read_in_the_totals_unit():
    from gpunb.units import energy

    assert [energy(512), energy(5844), energy(40_000), energy(4e6)] == ["512 J", "1.6 Wh", "11 Wh", "1.11 kWh"]
    # two GPUs of 2,922 J each under a total of 1.6 Wh: 0.81 Wh each, not "2,922 J"
    assert energy(2922, like=5844) == "0.81 Wh" and energy(2e6, like=4e6) == "0.56 kWh"
    assert energy(300, like=600) == "300 J"


@pytest.mark.parametrize("digits", [20, 100, 308, 309, 400, 5000])
def test_a_price_or_carbon_of_many_digits_is_refused_not_infinite(digits):
    big = "9" * digits
    for parse, text in ((parse_price, f"{big}/kWh"), (parse_carbon, f"{big}g/kWh")):
        with pytest.raises(ValueError, match="outside"):
            parse(text)


@pytest.mark.parametrize("text", ["0.25 kWh", "0.25 Wh", "0.25 MWh", "0.25kWh"])
def test_an_energy_unit_is_not_taken_for_a_currency(text):
    try:
        _, currency = parse_price(text)
    except ValueError as err:
        assert "slash" in str(err) or "not a price" in str(err)
    else:
        assert currency.lower() not in ("kwh", "wh", "mwh")
