"""The server extension's energy: each GPU's counter as a Prometheus counter, each kernel's share
of it while it held the GPU, and the idle-holder line (recorded H200 counter, fake clock)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunb.analysis.holders import gpus as gh
from gpunb.analysis.holders.kernel_energy import KernelEnergyLedger, idle_energy_line
from gpunb.analysis.holders.server import holder_lines
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.server_sessions import ServerReading
from gpunb.testing import scenario
from gpunb.views.metrics_view import metrics_text
from tests.test_gpu_holders import LESSON, NOW, TRAIN, facts_table

GiB = 2**30


class Clock:
    t = 1.0

    def __call__(self) -> float:
        return self.t


def fake_gpu(clock: Clock, pids=(100, 201, 300)):
    fake = scenario("h200", clock=clock)
    fake.gpus[0].extra_processes = [{"pid": p, "used_gpu_memory": GiB} for p in pids]
    return fake


def report(fake, clock: Clock, kernels=(LESSON, TRAIN)):
    return gh.build_report(NvmlSession(fake), kernels, facts_of=facts_table(), children_of=lambda pid: (),
                           now=lambda: NOW + clock.t)


def counter_j(fake, t: float) -> float:
    return fake.gpus[0].energy_at(t)[0] / 1000.0


def rows_by_pid(r) -> dict[int, gh.GpuHolder]:
    return {h.pid: h for h in r.devices[0].holders}


def test_the_gpus_energy_is_split_equally_among_the_holders_present_at_both_ends():
    clock = Clock()
    fake = fake_gpu(clock)
    ledger = KernelEnergyLedger()
    first = ledger.account(report(fake, clock))
    assert first.devices[0].energy_mj == fake.gpus[0].energy_at(1.0)[0]
    assert rows_by_pid(first)[100].energy_j is None  # nothing measured yet
    clock.t = 11.0
    second = ledger.account(report(fake, clock))
    delta = counter_j(fake, 11.0) - counter_j(fake, 1.0)
    assert delta > 100
    rows = rows_by_pid(second)
    # three holders: the lesson kernel, the training kernel (through its child 201), bob's script
    assert rows[100].energy_j == pytest.approx(delta / 3)
    assert rows[201].energy_j == pytest.approx(delta / 3)
    assert rows[300].energy_j is None  # not a kernel: its share goes to nobody
    # the lesson kernel was idle at both ends: its share is idle energy; the training kernel is busy
    assert rows[100].idle_energy_j == pytest.approx(delta / 3) and rows[100].idle_measured_s == pytest.approx(10.0)
    assert rows[201].idle_energy_j is None
    data = second.to_dict()["gpus"][0]
    assert data["energy_mj"] == fake.gpus[0].energy_at(11.0)[0]
    assert next(p for p in data["processes"] if p["pid"] == 100)["energy_j"] == pytest.approx(delta / 3)


def test_a_holder_that_came_or_went_meanwhile_gets_nothing_of_that_interval():
    clock = Clock()
    fake = fake_gpu(clock, pids=(100,))
    ledger = KernelEnergyLedger()
    ledger.account(report(fake, clock))
    clock.t = 6.0
    fake.gpus[0].extra_processes.append({"pid": 201, "used_gpu_memory": GiB})
    r = ledger.account(report(fake, clock))
    assert rows_by_pid(r)[100].energy_j == pytest.approx(counter_j(fake, 6.0) - counter_j(fake, 1.0))
    assert rows_by_pid(r)[201].energy_j is None
    # a kernel gone from the server is forgotten (its series ends)
    clock.t = 8.0
    r = ledger.account(report(fake, clock, kernels=(TRAIN,)))
    assert rows_by_pid(r)[100].energy_j is None and rows_by_pid(r)[201].energy_j is not None
    assert {kernel for kernel, _ in ledger._shares} == {"k-train"}


def test_a_counter_that_went_back_is_not_split():
    clock = Clock()
    fake = fake_gpu(clock, pids=(100,))
    ledger = KernelEnergyLedger()
    ledger.account(report(fake, clock))
    first = fake.gpus[0].energy
    fake.gpus[0].energy = [dict(row, energy_mj=row["energy_mj"] - 10**9) for row in first]  # driver reloaded
    clock.t = 5.0
    r = ledger.account(report(fake, clock))
    assert rows_by_pid(r)[100].energy_j is None


def test_metrics_export_the_gpu_counter_and_each_kernels_share():
    clock = Clock()
    fake = fake_gpu(clock)
    ledger = KernelEnergyLedger()
    ledger.account(report(fake, clock))
    clock.t = 11.0
    r = ledger.account(report(fake, clock))
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(r)[0].decode())}
    gpu = families["gpunb_gpu_energy_joules"]
    assert gpu.type == "counter"
    (sample,) = gpu.samples
    assert sample.name == "gpunb_gpu_energy_joules_total" and sample.labels["UUID"].startswith("GPU-")
    assert sample.value == pytest.approx(counter_j(fake, 11.0))
    per_kernel = {s.labels["path"]: s for s in families["gpunb_kernel_gpu_energy_joules"].samples}
    share = (counter_j(fake, 11.0) - counter_j(fake, 1.0)) / 3
    assert set(per_kernel) == {"course/lesson3.ipynb", "train.ipynb"}
    assert per_kernel["course/lesson3.ipynb"].value == pytest.approx(share)
    assert per_kernel["course/lesson3.ipynb"].labels["kernel_id"] == "k-lesson"
    idle = {s.labels["path"]: s.value for s in families["gpunb_kernel_gpu_idle_energy_joules"].samples}
    assert idle == {"course/lesson3.ipynb": pytest.approx(share), "train.ipynb": 0.0}


def _idle_row(measured_s: float, joules: float) -> gh.GpuHolder:
    return gh.GpuHolder(1, 100, 31 * GiB, gh.KERNEL, "k-lesson", 100, "lesson3.ipynb", "notebook", "idle",
                        NOW - 40 * 60, energy_j=joules, idle_energy_j=joules, idle_measured_s=measured_s)


def test_the_idle_holder_line_names_notebook_gpu_idle_time_and_energy():
    assert idle_energy_line(_idle_row(40 * 60, 70 * 3600), NOW) == "lesson3.ipynb held GPU 1 idle for 40 min: 70 Wh"
    assert idle_energy_line(_idle_row(12 * 60, 21 * 3600), NOW) == (
        "lesson3.ipynb held GPU 1 idle for 40 min, 12 min of it measured: 21 Wh")
    busy = gh.GpuHolder(1, 200, GiB, gh.KERNEL, "k-train", 200, "train.ipynb", "notebook", "busy", NOW,
                        energy_j=5000.0)
    assert idle_energy_line(busy, NOW) == ""
    data = {"t_unix": NOW, "gpus": [{"index": 1, "processes": [_idle_row(40 * 60, 70 * 3600).to_dict(),
                                                               busy.to_dict()]}]}
    lines = holder_lines(ServerReading(data, kernel_id="k-train", url="http://127.0.0.1:8888/"), 1)
    assert lines == ["lesson3.ipynb held GPU 1 idle for 40 min: 70 Wh; it holds 31.0 GiB",
                     "this notebook holds 1.0 GiB"]


def test_the_service_adds_the_energy_on_its_nvml_thread():
    from gpunb.shells.server_service import GpuReportService

    clock = Clock()
    fake = fake_gpu(clock)
    built = []

    def build(nvml, kernels, infos=None):
        built.append(report(fake, clock))
        return built[-1]

    service = GpuReportService(kernel_manager=None, nvml=NvmlSession(fake), build=build)
    try:
        service._blocking_report(())
        clock.t = 4.0
        r = service._blocking_report(())
    finally:
        service.close()
    assert rows_by_pid(r)[100].energy_j == pytest.approx((counter_j(fake, 4.0) - counter_j(fake, 1.0)) / 3)


def test_a_kernels_energy_says_it_is_a_share_and_whose_processes_moved_it():
    """Issue 31: another user's process on the same GPU takes part of every interval's energy;
    the kernel's row says with whom its share was split (other users' processes named)."""
    clock = Clock()
    fake = fake_gpu(clock)
    ledger = KernelEnergyLedger()
    ledger.account(report(fake, clock))
    clock.t = 11.0
    rows = rows_by_pid(ledger.account(report(fake, clock)))
    lesson = rows[100].energy_shared_with
    assert lesson.startswith("split equally with 2 other processes on this GPU: ")
    bob = rows[300]
    assert f"(PID {bob.pid}" in lesson and "kernel k-train" in lesson
    assert "its share of a GPU others also use: split equally with 2" in idle_energy_line(rows[100], NOW + 11.0)
    clock.t = 21.0
    alone = fake_gpu(clock, pids=(100,))
    ledger = KernelEnergyLedger()
    ledger.account(report(alone, Clock()))
    shared = rows_by_pid(ledger.account(report(alone, clock)))[100].energy_shared_with
    assert shared == "split equally with 1 other process on this GPU: a process (PID 412, user not visible)"


def test_figures_from_the_test_stand_ins_say_fake_in_json_and_metrics(monkeypatch):
    clock = Clock()
    r = report(fake_gpu(clock), clock)  # the recorded fake NVML: a recording, not this machine
    assert r.to_dict()["fake"] is True and r.to_dict()["fake_sources"] == ["fake NVML"]
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(r)[0].decode())}
    assert families["gpunb_fake_backend"].samples[0].value == 1.0
    monkeypatch.setenv("GPUNB_FAKE_NVIDIA_DEVICES", "/tmp/x")
    assert report(fake_gpu(clock), clock).fake == ("fake NVML", "GPUNB_FAKE_NVIDIA_DEVICES")


def test_a_kernel_shows_fake_when_its_server_answers_from_test_stand_ins():
    data = {"t_unix": NOW, "fake": True, "fake_sources": ["GPUNB_FAKE_NVML"],
            "gpus": [{"index": 1, "processes": [_idle_row(40 * 60, 70 * 3600).to_dict()]}]}
    lines = holder_lines(ServerReading(data, kernel_id="k-train", url="http://127.0.0.1:8888/"), 1)
    assert lines[0].startswith("fake: these figures come from gpunb's test stand-ins (GPUNB_FAKE_NVML)")
    assert lines[1].startswith("lesson3.ipynb held GPU 1 idle")
