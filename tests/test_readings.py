"""NVML readings through the fake built from the recorded H200 trace, with fault scenarios."""

import pytest

from gpunb.readings.gpu import clock_event_names, read_info, read_sample, read_snapshot
from gpunb.readings.nvml import NvmlSession, Unavailable, is_available
from gpunb.testing import load_trace, scenario


def snapshot(name):
    return read_snapshot(NvmlSession(scenario(name)))


def test_h200_facts_match_the_recording():
    facts = load_trace()["facts"]
    snap = snapshot("h200")
    assert snap.driver.nvml.ok
    assert snap.driver.driver_version == facts["driver_version"]
    assert snap.driver.cuda_driver_version == "13.0"
    (gpu,) = snap.gpus
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == facts["uuid"]
    assert gpu.memory_total_bytes == facts["memory_total"]
    assert gpu.compute_capability == (9, 0)
    assert gpu.power_limit_w == 700.0
    assert gpu.ecc_enabled is True and gpu.ecc_uncorrected_volatile == 0
    assert gpu.compute_mode == "default" and gpu.mig_enabled is False


def test_samples_follow_the_training_ramp():
    clock = {"t": 0.0}
    fake = scenario("h200", clock=lambda: clock["t"])
    nvml = NvmlSession(fake)
    idle = read_sample(nvml, 0)
    clock["t"] = 17.1  # inside the recorded training phase
    train = read_sample(nvml, 0)
    assert idle.util_gpu_pct == 0 and train.util_gpu_pct >= 98
    assert train.memory_used_bytes > idle.memory_used_bytes + 5 * 2**30
    assert train.power_w > 500
    assert clock_event_names(train.clock_event_reasons) == ["power cap"]
    assert clock_event_names(idle.clock_event_reasons) == ["idle"]


def test_no_driver_is_a_value_not_an_exception():
    snap = snapshot("no-driver")
    assert not snap.driver.nvml.ok
    assert "libnvidia-ml.so.1" in snap.driver.nvml.cause
    assert "nvidia-smi" in snap.driver.nvml.fix
    assert snap.gpus == ()


def test_not_supported_field_becomes_unavailable():
    snap = snapshot("power-not-supported")
    sample = snap.samples[0]
    assert isinstance(sample.power_w, Unavailable) and not sample.power_w
    assert sample.power_w.code == 3
    assert "not supported" in str(sample.power_w)
    assert is_available(sample.temp_c)  # the rest still reads


def test_lost_gpu_is_marked_and_others_still_read():
    snap = snapshot("second-gpu-lost")
    first, second = snap.gpus
    assert not first.lost and first.name == "NVIDIA H200"
    assert second.lost
    assert snap.samples[1].lost and not snap.samples[0].lost
    assert isinstance(snap.processes[1], Unavailable)


def test_mig_devices_are_listed():
    gpu = read_info(NvmlSession(scenario("mig")), 0)
    assert gpu.mig_enabled is True
    assert [m.uuid[:4] for m in gpu.mig_devices] == ["MIG-", "MIG-"]


def test_session_starts_nvml_once():
    fake = scenario("h200")
    nvml = NvmlSession(fake)
    for _ in range(3):
        read_sample(nvml, 0)
    assert fake.calls["nvmlInit"] == 1


@pytest.mark.parametrize("name", ["h200", "two-gpus", "busy", "mig", "gpu-lost", "power-not-supported", "eight-gpus",
                                  "h200x2-nvlink", "pcie-pair"])
def test_every_scenario_reads_without_raising(name):
    snap = snapshot(name)
    assert len(snap.samples) == len(snap.gpus) == len(snap.processes)


def test_every_documented_scenario_is_accepted_by_gpunb_fake_nvml():
    """GPUNB_FAKE_NVML takes the names in SCENARIOS only: each scenario scenario() documents
    (the screenshots use eight-gpus, tutorial 05 h200x2-nvlink) must be among them."""
    import re

    from gpunb.readings.nvml import _fake_session
    from gpunb.testing.fake_nvml import SCENARIOS

    documented = re.findall(r"^    ``([a-z0-9-]+)``", scenario.__doc__, re.M)
    assert len(documented) >= 10 and set(documented) == set(SCENARIOS)
    for name in documented:  # a known name is the fake, not the "names no recorded scenario" refusal
        assert _fake_session(name).fake and "GPUNB_FAKE_NVML" not in _fake_session(name).start().cause, name
    assert not _fake_session("bogus").start().ok


def test_gpunb_fake_nvml_from_s_starts_the_replay_that_far_in(monkeypatch):
    """A notebook of views reads the phase it means to show (the recording holds 2 GiB from
    6.2 s on, after 6 s of an idle GPU), however fast the machine runs it."""
    from gpunb.readings.nvml import _fake_session

    monkeypatch.setenv("GPUNB_FAKE_NVML_FROM_S", "8")
    used = _fake_session("h200").device_query(0, "nvmlDeviceGetMemoryInfo").used
    assert 2 * 2**30 <= used < 3 * 2**30
    monkeypatch.delenv("GPUNB_FAKE_NVML_FROM_S")
    assert _fake_session("h200").device_query(0, "nvmlDeviceGetMemoryInfo").used < 2**30  # idle at the start
    for bad in ("soon", "-1"):
        monkeypatch.setenv("GPUNB_FAKE_NVML_FROM_S", bad)
        status = _fake_session("h200").start()
        assert not status.ok and "GPUNB_FAKE_NVML_FROM_S" in status.cause and status.fix
