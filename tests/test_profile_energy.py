"""Energy and link traffic inside ``%%gpuprofile`` / ``gpunb.profile()`` (issue 23), on the CPU:
``torch.cuda`` is the stand-in of ``test_profile_cuda_paths.py`` and NVML the fake that replays
the H200's recorded energy counter, power and PCIe throughput. The real figures are checked by
tests/gpu/test_energy_gpu.py and benchmarks/energy_accuracy.py."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import gpunb  # noqa: E402
from gpunb.analysis.energy import meter as meter_module  # noqa: E402
from gpunb.analysis.energy.links import CellLinks, PcieTraffic  # noqa: E402
from gpunb.analysis.energy.meter import COUNTER, ESTIMATE, CellEnergy, EnergyMeter, GpuEnergy  # noqa: E402
from gpunb.analysis.energy.tariff import Tariff, set_session_tariff  # noqa: E402
from gpunb.analysis.profile.cell_energy import NO_GPU, NO_NVML  # noqa: E402
from gpunb.analysis.profile.history import compare  # noqa: E402
from gpunb.analysis.profile.link_verdict import nvlink_peak_gbps, pcie_words, with_links  # noqa: E402
from gpunb.analysis.profile.records import Verdict  # noqa: E402
from gpunb.analysis.steps.tokens import sequence_length  # noqa: E402
from gpunb.readings import nvml as nvml_module  # noqa: E402
from gpunb.readings import peak_cache  # noqa: E402
from gpunb.readings.nvml import NvmlSession  # noqa: E402
from gpunb.testing import replay_clock, scenario  # noqa: E402
from gpunb.views.energy_view import energy_line  # noqa: E402


def _train(seconds: float, batch: int = 8, tokens: bool = False, sleep_s: float = 0.004) -> None:
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 100, (64, 16)) if tokens else torch.randn(64, 16)
    data = torch.utils.data.TensorDataset(x, torch.randn(64, 1))
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for xb, yb in torch.utils.data.DataLoader(data, batch_size=batch):
            torch.nn.functional.mse_loss(model(xb.float()), yb).backward()
            opt.step()
            time.sleep(sleep_s)


@pytest.fixture(autouse=True)
def _no_tariff(monkeypatch):
    monkeypatch.delenv("GPUNB_ENERGY_PRICE", raising=False)
    monkeypatch.delenv("GPUNB_CARBON_INTENSITY", raising=False)
    set_session_tariff(None)
    yield
    set_session_tariff(None)


# -- the numbers reach the record and the view -----------------------------------------------

def test_a_profiled_gpu_cells_energy_reaches_the_record_and_the_view(fake_cuda):
    with gpunb.profile(record=False, show=False) as p:
        _train(1.8, tokens=True)
    r = p.result
    e = r.energy
    assert e is not None and r.energy_absent == ""
    assert [g.index for g in e.gpus] == [0] and e.gpus[0].source == COUNTER and not e.estimated
    assert e.joules > 0 and e.average_w is not None and e.wh == pytest.approx(e.joules / 3600)
    assert e.step_joules is not None and e.window_steps > 10 and e.window_s >= 1.0  # a steady window of >= 1 s
    assert e.batch_size == 8 and e.sample_joules == pytest.approx(e.step_joules / 8)
    assert e.samples_per_joule == pytest.approx(1 / e.sample_joules)
    assert e.idle_share is not None  # from the cell's utilization samples
    # tokens: the batches are 2-D integer token ids of length 16
    assert r.steps.tokens_per_sample == 16 and not r.steps.tokens_given
    assert r.steps.tokens_per_s == pytest.approx(r.steps.samples_per_s * 16)
    assert e.tokens_per_joule == pytest.approx(e.samples_per_joule * 16)
    # PCIe: sampled on the kernel's GPU, measured against the datasheet (no %gpucheck ran)
    assert r.links is not None and r.links.pcie and r.links.pcie[0].samples >= 2
    assert r.links.h2d_peak_gbps and "datasheet" in r.links.h2d_peak_source
    text = str(r)
    line = next(ln for ln in text.splitlines() if "Energy " in ln)
    assert " Wh in " in line and " W average: " in line and "J per step" in line and "samples/J" in line
    assert "tokens/J" in line and "spent idle" in line and "estimate" not in line
    assert text.index("Energy ") < text.index("  time ")  # near the top, before the measurements
    html = r._repr_mimebundle_()["text/html"]
    assert "<details class='gpunb-energy'" in html and "per GPU" in html and "PCIe" in html
    assert html.index("gpunb-energy") < html.index("<table")  # above the table of measurements
    d = json.loads(json.dumps(r.to_dict()))
    assert d["energy"]["joules"] == pytest.approx(e.joules) and d["energy"]["wh"] == pytest.approx(e.wh)
    assert d["energy"]["samples_per_joule"] == pytest.approx(e.samples_per_joule)
    assert d["links"]["pcie"][0]["samples"] == r.links.pcie[0].samples


def test_money_and_co2_only_when_the_user_named_a_price(fake_cuda):
    with gpunb.profile(record=False, show=False) as p:
        _train(0.4)
    assert "CO₂" not in energy_line(p.result) and "€" not in energy_line(p.result)
    set_session_tariff(Tariff(0.25, "€", 350.0))
    line = energy_line(p.result)
    assert "€" in line and "g CO₂" in line
    assert "price" in str(p.result)


def test_without_the_counter_the_cell_shows_the_estimate_and_says_so(fake_cuda):
    nvml_module.default_session()._lib.gpus[0].energy = None  # a GPU without the counter (pre-Volta)
    with gpunb.profile(record=False, show=False) as p:
        _train(0.6)
    e = p.result.energy
    assert e is not None and e.estimated and e.gpus[0].source == ESTIMATE and e.joules > 0
    assert e.step_joules is None  # no counter marks: no per-step figure
    assert "an estimate from power samples" in energy_line(p.result)


def test_no_driver_means_no_energy_and_the_reason_not_an_error(fake_cuda):
    nvml_module.set_default_session(NvmlSession(scenario("no-driver")))
    with gpunb.profile(record=False, show=False) as p:
        _train(0.2)
    assert p.result.energy is None and p.result.energy_absent == NO_NVML and p.result.links is None
    assert "Energy not measured: NVML did not name the cell's GPU" in str(p.result)


def test_a_cell_without_a_gpu_measures_no_energy_and_keeps_the_report_short(fake_nvml):
    with gpunb.profile(record=False, show=False) as p:
        _train(0.2)
    assert p.result.gpu is None and p.result.energy is None and p.result.energy_absent == NO_GPU
    assert "Energy" not in str(p.result)  # the GPU row already says why there is no GPU part


def test_energy_off_measures_nothing_and_never_calls_the_meter(fake_cuda, monkeypatch):
    asked = []
    monkeypatch.setattr(meter_module.EnergyMeter, "at_step", lambda self, steps: asked.append(steps))
    with gpunb.profile(record=False, show=False, energy=False) as p:
        _train(0.2)
    assert p.result.energy is None and p.result.energy_absent == "" and p.result.links is None and not asked
    assert "Energy" not in str(p.result)
    with gpunb.profile(record=False, show=False) as p:
        _train(0.2)
    assert asked  # the step hook feeds the meter when energy is on


def test_the_step_hook_never_waits_for_nvml(fake_cuda, monkeypatch):
    """A slow driver (every energy read 50 ms) costs the steps nothing: the reads run on the NVML worker."""
    fake = nvml_module.default_session()._lib
    real = fake.nvmlDeviceGetTotalEnergyConsumption

    def slow(handle):
        time.sleep(0.05)
        return real(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetTotalEnergyConsumption", slow)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpunb.profile(record=False, show=False, timeline=False) as p:
        t0 = time.perf_counter()
        for _ in range(200):
            opt.step()
        loop_s = time.perf_counter() - t0
    assert p.result.steps.count == 200
    assert loop_s < 1.0  # 200 steps that waited for one 50 ms read each would take 10 s


# -- tokens ---------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, expected", [
    ((torch.zeros(8, 128, dtype=torch.long), torch.zeros(8)), 128),  # token ids and labels
    ({"input_ids": torch.zeros(4, 512, dtype=torch.int32), "attention_mask": torch.ones(4, 512)}, 512),
    ({"attention_mask": torch.ones(4, 64), "input_ids": torch.zeros(4, 64, dtype=torch.long)}, 64),
    ((torch.randn(8, 16), torch.zeros(8, dtype=torch.long)), None),  # feature rows
    (torch.zeros(8, 3, 32, 32, dtype=torch.uint8), None),  # images
    (torch.zeros(8, 224, dtype=torch.uint8), None),  # uint8: pixels, not token ids
    (torch.zeros(8, dtype=torch.long), None),  # class labels only
    ("text", None),
])
def test_tokens_per_sample_is_read_from_token_ids_only(batch, expected):
    assert sequence_length(batch) == expected


def test_tokens_per_sample_given_wins_and_is_checked(fake_cuda):
    with gpunb.profile(record=False, show=False, tokens_per_sample=256) as p:
        _train(0.3, tokens=True)
    assert p.result.steps.tokens_per_sample == 256 and p.result.steps.tokens_given
    with pytest.raises(ValueError, match="tokens_per_sample must be a whole number >= 1"):
        gpunb.profile(tokens_per_sample=0)
    with pytest.raises(TypeError, match="energy must be True or False"):
        gpunb.profile(energy="no")


# -- the magic's flags ----------------------------------------------------------------------

def test_magic_flags_and_help(ip, capsys, fake_cuda):
    ip.user_ns["_train"] = _train
    r = ip.run_cell("%%gpuprofile --no-energy -o _gpunb_e\n_train(0.2)\n")
    assert r.success and ip.user_ns["_gpunb_e"].energy is None
    r = ip.run_cell("%%gpuprofile --tokens-per-sample 64 -o _gpunb_e\n_train(0.3)\n")
    assert r.success and ip.user_ns["_gpunb_e"].energy is not None
    assert ip.user_ns["_gpunb_e"].steps.tokens_per_sample == 64
    r = ip.run_cell("%%gpuprofile --tokens-per-sample 0\n_gpunb_ran = 1\n")
    assert not r.success and "--tokens-per-sample" in str(r.error_in_exec) and "_gpunb_ran" not in ip.user_ns
    r = ip.run_cell("%gpuprofile history --no-energy")
    assert not r.success and "--no-energy" in str(r.error_in_exec)
    capsys.readouterr()
    ip.run_cell("%gpuprofile --help")
    out = capsys.readouterr().out
    assert "--no-energy" in out and "--tokens-per-sample" in out and "energy counter" in out


# -- history ------------------------------------------------------------------------------

def _entry(sample_j: float | None, step_j: float = 1.0, batch: int | None = 8):
    energy = CellEnergy((GpuEnergy(0, 100.0, 1.0, COUNTER),), 1.0, step_j, 100, 1.0,
                        batch) if sample_j is not None else None
    if energy is not None and batch:
        energy = CellEnergy(energy.gpus, 1.0, sample_j * batch, 100, 1.0, batch)
    return SimpleNamespace(wall_s=1.0, peak_vram_bytes=None, peak_rss_bytes=None, energy=energy,
                           steps=SimpleNamespace(median_ms=10.0, samples_per_s=None, batch_size=batch),
                           gpu=None, flops=None)


def test_history_compares_energy_per_sample_with_the_last_run_of_the_cell():
    words = compare(_entry(0.05), _entry(0.031)).words()
    assert "−38% energy per sample" in words
    assert "+20% energy per sample" in compare(_entry(0.05), _entry(0.06)).words()
    assert "energy per sample: same" in compare(_entry(0.05), _entry(0.0505)).words()
    assert "energy" not in compare(_entry(None), _entry(0.05)).words()  # one run measured none


def test_history_table_has_the_energy_per_sample_of_real_runs(ip, capsys, fake_cuda):
    ip.user_ns["_train"] = _train
    for _ in range(2):
        assert ip.run_cell("%%gpuprofile --label energy-run\n_train(1.9)\n").success
    capsys.readouterr()
    ip.run_cell("%gpuprofile history -o _gpunb_h")
    report = ip.user_ns["_gpunb_h"]
    text = str(report)
    assert "/sample" in text and "energy per sample" in text.splitlines()[0]


# -- links in the verdict ----------------------------------------------------------------------

def _links(rx_gbps: float, peak: float = 53.0, source: str = "%gpucheck's pinned copy, 2026-12-01 10:00"):
    return CellLinks((PcieTraffic(0, rx_gbps * 1e9, 0.1e9, rx_gbps * 1e9, 8, 4.0),), {}, 4.0, peak, source)


def test_an_input_bound_verdict_says_whether_the_bus_or_the_pipeline_is_the_limit():
    v = Verdict("input-bound", "waiting for data", "40% of the loop waited for the next DataLoader batch")
    got = with_links(v, _links(11.0))
    assert got.reason.endswith("host→GPU 11.0 GB/s of the 53 GB/s %gpucheck measured: the input pipeline, "
                               "not the bus, is the limit")
    assert "the bus itself is near its limit" in pcie_words(_links(50.0))
    assert "link's 63 GB/s datasheet rate" in pcie_words(_links(5.0, 63.0, "PCIe gen5 x16 datasheet"))
    assert with_links(Verdict("compute-bound", "the GPU is the limit", "busy"), _links(11.0)).reason == "busy"
    assert with_links(v, None) == v


def test_a_multi_gpu_verdict_names_nvlink_traffic_against_its_peak():
    assert nvlink_peak_gbps("NVLink × 18 through NVSwitch, 478 GB/s per direction") == 956.0
    assert nvlink_peak_gbps("PCIe (NODE), peer access ok") is None
    links = CellLinks((), {0: 40 * 10**9, 1: 41 * 10**9}, 2.0, None, "", 956.0)
    got = with_links(Verdict("multi-gpu", "2 ranks trained", "the ranks keep the same pace"), links)
    assert "NVLink 20.5 of 956 GB/s" in got.reason


def test_the_peak_cache_keeps_the_checks_pinned_copy_bandwidth(tmp_path):
    env = {"GPUNB_CACHE_DIR": str(tmp_path)}
    peak_cache.remember("GPU-abc", "NVIDIA H200", {"bf16_tflops": 790.0}, environ=env,
                        copy={"pinned_gbps": 53.2})
    peak_cache.forget_this_process()
    got = peak_cache.lookup("GPU-abc", env)
    assert got is not None and got.h2d_gbps == pytest.approx(53.2)
    peak_cache.remember("GPU-def", "NVIDIA H200", {"bf16_tflops": 790.0}, environ=env)  # no copy probe
    peak_cache.forget_this_process()
    assert peak_cache.lookup("GPU-def", env).h2d_gbps is None


# -- marks taken as the counter moves ------------------------------------------------------------

def test_step_marks_are_read_as_the_counter_moves_with_the_steps_of_that_moment():
    start = time.monotonic()  # the meter's times are put on the fake's clock below
    fake = scenario("h200", clock=lambda: 16.0 + (time.monotonic() - start))
    nvml = NvmlSession(fake)
    meter = EnergyMeter(nvml, [0], fresh=0)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 2.0:
        steps += 1
        meter.at_step(steps)
        time.sleep(0.005)
    cell = meter.finish(warmup_steps=1)
    assert cell is not None and len(meter.marks) >= 3
    # each mark's reading is the counter's value just after it moved (it moves every ~70 ms in the
    # recording), dated to when it moved: within 30 ms of the mark it read less before and the same
    # after. A reading at any moment would be so 40 % of the time; one mark may miss under a
    # loaded CPU.
    counter = fake.gpus[0].energy_at
    fresh = 0
    for m in meter.marks:
        fake_t = 16.0 + (meter.t0 + m.t_s - start)
        fresh += counter(fake_t - 0.03)[0] < m.energy_mj[0] == counter(fake_t + 0.03)[0]
    assert len(meter.marks) >= 4 and fresh >= len(meter.marks) - 1
    assert all(0 < m.steps <= steps for m in meter.marks)
    assert cell.step_joules is not None


def test_marks_count_the_steps_the_gpu_finished_not_the_ones_the_host_queued():
    """The host runs up to a launch queue ahead of the GPU: a mark 1 s into the cell is put among
    the steps by their CUDA events (step i ended sum(step_ms[:i+1]) after the start event)."""
    from gpunb.analysis.profile.cell_energy import gpu_steps_at

    steps = SimpleNamespace(source="CUDA events", step_ms=(500.0,) + (10.0,) * 200)  # ends at 0.5, 0.51, ...
    profile = SimpleNamespace(steps=steps)
    at = gpu_steps_at(profile, cell_t0=100.0, meter_t0=100.2)  # the meter started 0.2 s after the cell
    assert at(0.2) == 0 and at(0.3) == 1 and at(0.405) == 11 and at(5.0) == 201
    assert gpu_steps_at(SimpleNamespace(steps=SimpleNamespace(source="host clock", step_ms=(1.0,))), 0, 0) is None


def test_the_cells_end_does_not_wait_for_a_mark_still_waiting_for_the_counter():
    t = {"t": 20.0}
    nvml = NvmlSession(scenario("h200", clock=lambda: t["t"]))  # a frozen clock: the counter never moves
    meter = EnergyMeter(nvml, [0], fresh=0)
    meter._start.result()
    meter.at_step(1)  # the worker now waits up to FRESH_WAIT_S for a move that never comes
    time.sleep(0.01)
    t0 = time.perf_counter()
    cell = meter.finish()
    assert time.perf_counter() - t0 < 0.6 * meter_module.FRESH_WAIT_S
    assert cell is not None and cell.joules == 0


def test_a_multi_gpu_cell_has_energy_per_gpu_summed_and_per_rank_and_nvlink_in_its_verdict():
    """The ranks trained on GPUs 0 and 1 of the recorded NVLink pair; the kernel used no GPU."""
    import dataclasses

    from gpunb.analysis.profile.cell_energy import CellMeters, with_energy
    from gpunb.analysis.profile.rank_verdict import judge_ranks
    from gpunb.analysis.ranks.summary import build_ranks
    from tests.test_profile_ranks import _ddp, _record

    nvml = NvmlSession(scenario("h200x2-nvlink", clock=replay_clock(16.0)))
    meters = CellMeters(nvml, None)  # a kernel without CUDA: every GPU's counter is read at the start
    time.sleep(0.4)
    records = [_record(r, 50, [500.0] + [50.0] * 49, ddp=_ddp(20.0, 5.0)) for r in (0, 1)]
    part = build_ranks(records, nvml=nvml, traffic={0: 12 * 10**9, 1: 13 * 10**9})
    verdict, _ = judge_ranks(part)
    with gpunb.profile(record=False, show=False, energy=False) as p:
        pass
    profile = dataclasses.replace(p.result, ranks=part, verdict=verdict)
    got = with_energy(profile, meters, warmup_steps=1, torch=None, tokens_given=None, tokens_seen=None,
                      cell_t0=0.0)
    e = got.energy
    assert e is not None and [g.index for g in e.gpus] == [0, 1]
    assert e.joules == pytest.approx(sum(g.joules for g in e.gpus)) and all(g.joules > 0 for g in e.gpus)
    assert got.links is not None and got.links.nvlink_bytes == {0: 12 * 10**9, 1: 13 * 10**9}
    assert got.links.nvlink_peak_gbps == 956.0
    assert "NVLink" in got.verdict.reason and "of 956 GB/s" in got.verdict.reason
    text = str(got)
    assert "on 2 GPUs" in text and "per rank: rank 0 on GPU 0" in text and "rank 1 on GPU 1" in text
    assert "NVLink: GPU 0 12.00 GB, GPU 1 13.00 GB sent + received" in text
    assert "PCIe" not in text  # the ranks' GPUs were not sampled while the cell ran: no end-only figure


def test_a_cell_that_starts_cuda_itself_samples_its_gpu_from_the_first_step_that_finds_cuda_up(fake_cuda,
                                                                                                monkeypatch):
    up = {"cuda": False}
    monkeypatch.setattr(fake_cuda, "is_initialized", lambda: up["cuda"], raising=False)
    seen = {}
    real_finish = gpunb.analysis.profile.cell_energy.CellMeters.finish

    def finish(self, *args, **kwargs):
        seen["fresh"], seen["pcie"] = self.energy.fresh, self.pcie.indices
        return real_finish(self, *args, **kwargs)

    monkeypatch.setattr(gpunb.analysis.profile.cell_energy.CellMeters, "finish", finish)
    with gpunb.profile(record=False, show=False) as p:
        up["cuda"] = True  # the cell's model.cuda()
        _train(1.0)
    assert seen == {"fresh": 0, "pcie": (0,)}
    assert p.result.energy is not None and p.result.links is not None and p.result.links.pcie[0].samples >= 2


def test_a_failure_inside_the_energy_readings_costs_only_the_energy_line(fake_cuda, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("driver said nonsense")

    monkeypatch.setattr(gpunb.analysis.profile.cell_energy.CellMeters, "finish", broken)
    with gpunb.profile(record=False, show=False) as p:
        _train(0.2)
    assert p.result.energy is None and "RuntimeError: driver said nonsense" in p.result.energy_absent
    assert p.result.steps.count > 0 and "Energy not measured: the energy readings failed" in str(p.result)


def test_a_price_too_small_to_show_in_four_decimals_says_under():
    from gpunb.views.energy_view import price_words

    tiny = CellEnergy((GpuEnergy(0, 100.0, 1.0, COUNTER),), 1.0)  # 0.028 Wh
    assert price_words(tiny, Tariff(0.25, "€", None)) == "under €0.0001"
    assert price_words(tiny, Tariff(0.25, "EUR", 350.0)) == "under 0.0001 EUR, 0.00972 g CO₂"
    big = CellEnergy((GpuEnergy(0, 3.6e6, 3600.0, COUNTER),), 3600.0)  # 1 kWh
    assert price_words(big, Tariff(0.25, "€", None)) == "€0.25"
    assert price_words(big, Tariff()) == ""


def _benchmark_on_cpu(name: str, out) -> tuple[str, dict]:
    """(what benchmarks/``name``.py printed, its JSON) after a ``--device cpu`` run into ``out``."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / f"{name}.py"), "--out", str(out),
                        "--device", "cpu"], capture_output=True, text=True, cwd=root, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads((out / f"{name}.json").read_text())


def test_the_accuracy_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/energy_accuracy.py's code path (no GPU: no energy, the table still printed)."""
    stdout, report = _benchmark_on_cpu("energy_accuracy", tmp_path)
    assert [x["loop"] for x in report["results"]] == ["launch-bound", "compute-bound"]
    assert all(c["gpunb_j"] is None and c["why"] for x in report["results"] for c in x["cells"])
    assert "the step hook's energy call" in stdout and report["at_step_us"] > 0


def test_the_meter_cost_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/energy_meter_cost.py's code path (no NVML: the NVML suspects are left out)."""
    stdout, report = _benchmark_on_cpu("energy_meter_cost", tmp_path)
    assert list(report["variants"]) == ["plain", "profile", "profile+energy", "energy-no-polling", "energy-no-pcie",
                                        "gil-wakeups"]
    assert [v["vs"] for v in report["variants"].values()] == ["plain", "plain", "profile", "profile", "profile",
                                                              "plain"]
    assert all(len(v["step_ms"]) == 3 and v["step_ms_median"] > 0 for v in report["variants"].values())
    assert "profile+energy" in stdout
