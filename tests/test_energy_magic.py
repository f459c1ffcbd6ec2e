"""%gpuenergy / gpunb.energy(): the energy since %load_ext from the (fake, recorded H200) counter,
the tariff it is priced with and where that came from, and the one line without a GPU."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import gpunb
from gpunb.analysis.energy.meter import COUNTER, CellEnergy, GpuEnergy
from gpunb.analysis.energy.since_load import SINCE_FIRST_ASK, SINCE_LOAD, SinceLoad, read_snapshot
from gpunb.analysis.energy.tariff import CARBON_ENV, PRICE_ENV, set_session_tariff
from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.shells.extension import kernel_state
from gpunb.testing.fake_nvml import scenario


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fake(clock):
    fake = scenario("h200", clock=clock)
    nvml_module.set_default_session(NvmlSession(fake))
    yield fake
    nvml_module.set_default_session(None)


@pytest.fixture(autouse=True)
def no_tariff(monkeypatch):
    monkeypatch.delenv(PRICE_ENV, raising=False)
    monkeypatch.delenv(CARBON_ENV, raising=False)
    set_session_tariff(None)
    yield
    set_session_tariff(None)


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    with capture_output():  # "not loaded" when it was not
        ip.run_line_magic("unload_ext", "gpunb")
    yield ip
    with capture_output():
        ip.run_line_magic("unload_ext", "gpunb")
    ip.user_ns.pop("spent", None)


def shown(out) -> str:
    """What a captured cell printed and displayed (text forms)."""
    return out.stdout + "".join(o.data.get("text/plain", "") for o in out.outputs)


def counter_j(fake, t: float) -> float:
    return fake.gpus[0].energy_at(t)[0] / 1000.0


def test_the_load_reads_no_counter_and_the_load_cell_reads_it_in_the_background(fake, clock, shell):
    shell.run_line_magic("load_ext", "gpunb")
    since = kernel_state(shell).energy_since_load
    assert since is not None and not since.begun  # the load itself: no NVML
    shell.run_cell("pass")  # the cell's end queues the first reading
    assert since.begun
    first = since.first()
    assert first.counters_mj == {0: fake.gpus[0].energy_at(0.0)[0]}


def test_since_load_is_the_counter_difference(fake, clock, shell):
    shell.run_line_magic("load_ext", "gpunb")
    kernel_state(shell).energy_since_load = SinceLoad(nvml_module.default_session, clock=clock)  # fake time
    shell.run_cell("pass")  # what the load cell's end does: the first reading
    kernel_state(shell).energy_since_load.first()
    clock.t = 42.0  # the recording replays: the counter moved meanwhile
    with capture_output() as out:
        shell.run_cell("%gpuenergy -o spent")
    spent = shell.user_ns["spent"]
    expected = counter_j(fake, 42.0) - counter_j(fake, 0.0)
    assert expected > 0
    assert spent.joules == pytest.approx(expected)
    assert spent.since == SINCE_LOAD and spent.gpus[0].uuid.startswith("GPU-")
    first_line = shown(out).splitlines()[0]
    assert first_line.startswith("This kernel's GPU spent") and " in the 42 s since %load_ext gpunb, " in first_line
    assert "€" not in shown(out) and "CO₂:" not in first_line  # no price set: no money


def test_seconds_and_average_power_come_from_the_same_clock(fake, clock):
    since = SinceLoad(nvml_module.default_session, clock=clock)
    since.begin()
    since.first()
    clock.t = 10.0
    report = since.report(gpunb.analysis.energy.tariff.Tariff(), "")
    assert report.seconds == pytest.approx(10.0)
    assert report.average_w == pytest.approx(report.joules / 10.0)


def test_price_and_carbon_turn_wh_into_money_and_co2_and_say_where_they_came_from(fake, clock, shell):
    shell.run_cell("%load_ext gpunb")
    kernel_state(shell).energy_since_load.first()
    clock.t = 60.0
    with capture_output() as out:
        shell.run_line_magic("gpuenergy", "--price €0.25/kWh --carbon 350g/kWh")
    # the report at once, priced: its last line names the tariff, so nothing says it twice
    seen = shown(out).strip().splitlines()
    assert out.stdout == "" and "€" in seen[0] and "g CO₂" in seen[0]
    assert "Priced at €0.25/kWh, 350 g CO₂/kWh, set with %gpuenergy in this kernel." in seen
    report = gpunb.energy()
    assert report.cost == pytest.approx(report.wh / 1000 * 0.25)
    assert report.co2_g == pytest.approx(report.wh / 1000 * 350)
    text = str(report)
    assert text.splitlines()[0].endswith(f"{report.tariff.spent_words(report.wh)}, {report.co2_g:,.1f} g CO₂.")
    assert "set with %gpuenergy in this kernel" in text
    # one value given keeps the other
    with capture_output():
        shell.run_line_magic("gpuenergy", "--price 0.30/kWh")
    assert gpunb.energy().tariff.carbon_g_per_kwh == 350
    with capture_output() as out:
        shell.run_line_magic("gpuenergy", "--forget")
    assert "no price or carbon intensity set" in out.stdout
    assert gpunb.energy().cost is None


def test_a_price_set_where_nothing_is_measured_shows_the_reason_and_the_price(shell):
    nvml_module.set_default_session(NvmlSession(scenario("no-driver")))
    try:
        shell.run_cell("%load_ext gpunb")
        with capture_output() as out:
            shell.run_line_magic("gpuenergy", "--price 0.25/kWh")
    finally:
        nvml_module.set_default_session(None)
    lines = shown(out).strip().splitlines()
    assert len(lines) == 2 and "nothing to measure" in lines[0]
    assert lines[1] == "Priced at 0.25/kWh, set with %gpuenergy in this kernel."


def test_the_environment_is_the_config_equivalent(fake, clock, shell, monkeypatch):
    monkeypatch.setenv(PRICE_ENV, "0.40 EUR/kWh")
    shell.run_cell("%load_ext gpunb")
    report = gpunb.energy()
    assert report.tariff.price_per_kwh == 0.40
    assert report.tariff_source == f"from the environment: {PRICE_ENV}"
    monkeypatch.setenv(CARBON_ENV, "lots")
    report = gpunb.energy()
    assert any("lots" in note for note in report.tariff_notes)


@pytest.mark.parametrize("line, words", [
    ("--price cheap", "--price 'cheap' is not a price per energy"),
    ("--carbon 350", None),  # a bare number is grams per kWh: accepted
    ("--carbon 350g/kWh/h", "is not a carbon intensity"),
    ("--forget --price 0.2/kWh", "--forget clears the price and carbon: give it alone"),
    ("--prise 0.2/kWh", "did you mean --price?"),
])
def test_bad_arguments_fail_the_cell_with_their_cause(fake, shell, line, words):
    shell.run_line_magic("load_ext", "gpunb")
    if words is None:
        with capture_output():
            shell.run_line_magic("gpuenergy", line)
        return
    with pytest.raises(UsageError, match=words.replace("?", r"\?")):
        shell.run_line_magic("gpuenergy", line)


def test_without_a_driver_one_clear_line(shell):
    nvml_module.set_default_session(NvmlSession(scenario("no-driver")))
    try:
        shell.run_cell("%load_ext gpunb")
        with capture_output() as out:
            shell.run_cell("%gpuenergy")
    finally:
        nvml_module.set_default_session(None)
    lines = shown(out).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpunb: ") and "nothing to measure" in lines[0]
    assert "NVIDIA" in lines[0] or "NVML" in lines[0]


def test_a_gpu_without_a_counter_is_said_so(clock, shell):
    fake = scenario("h200", clock=clock)
    fake.gpus[0].energy = None
    nvml_module.set_default_session(NvmlSession(fake))
    try:
        report = gpunb.energy()
    finally:
        nvml_module.set_default_session(None)
    assert not report.gpus and "no GPU energy counter here" in report.problem
    assert len(str(report).splitlines()) == 1


def test_without_the_extension_the_first_call_starts_the_count(fake, clock):
    from gpunb.shells.kernel_state import STANDALONE_STATE

    STANDALONE_STATE.energy_since_load = None
    try:
        first = gpunb.energy()
        assert first.just_started and "counting this kernel's GPU energy from now" in str(first)
        clock.t = 5.0
        later = gpunb.energy()
        assert not later.just_started and later.joules == pytest.approx(counter_j(fake, 5.0) - counter_j(fake, 0.0))
    finally:
        STANDALONE_STATE.energy_since_load = None


def test_a_failed_first_reading_counts_from_the_first_ask(clock):
    fake = scenario("h200", clock=clock)
    session = NvmlSession(fake)
    since = SinceLoad(lambda: session, clock=clock)
    fake.gpus[0].energy, energy = None, fake.gpus[0].energy
    since.begin()
    while not since._pending.ready():  # the reading after the load finds no counter...
        time.sleep(0.01)
    fake.gpus[0].energy = energy  # ...and the driver answers later
    report = since.report(gpunb.analysis.energy.tariff.Tariff(), "")
    assert report.since == SINCE_FIRST_ASK and report.just_started


def test_the_kernels_gpus_follow_cuda_visible_devices(clock):
    session = NvmlSession(scenario("two-gpus", clock=clock))
    both = read_snapshot(session, {}, clock)
    assert sorted(both.counters_mj) == [0, 1]
    second = read_snapshot(session, {"CUDA_VISIBLE_DEVICES": "1"}, clock)
    assert sorted(second.counters_mj) == [1]
    none = read_snapshot(session, {"CUDA_VISIBLE_DEVICES": ""}, clock)
    assert not none.counters_mj and "leaves this kernel no GPU" in none.problem


def test_the_last_profiled_cell_is_shown_with_its_energy(fake, clock, shell):
    shell.run_cell("%load_ext gpunb")
    cell = CellEnergy((GpuEnergy(0, 3600.0, 12.0, COUNTER),), 12.0, step_joules=6.4, window_steps=100,
                      window_s=10.0, batch_size=64)
    profiled = SimpleNamespace(label="", cell=7, steps=(), energy=cell)
    history = kernel_state(shell).profile_history
    history.add(profiled)
    try:
        report = gpunb.energy()
    finally:
        history.clear()  # the kernel state outlives the extension: a later test's history must not see it
    assert report.last_cell is cell and report.last_cell_name == "cell 7"
    line = str(report).splitlines()[1]
    assert line == "Last profiled cell 7: 1.0 Wh in 12 s, 300 W on average, 0.1 J per sample."
    html = report._repr_mimebundle_()["text/html"]
    assert "Last profiled cell 7" in html and "<details>" in html

