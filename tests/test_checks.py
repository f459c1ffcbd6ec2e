"""The checklist against the fake NVML (real H200 readings) and the recorded H200 CUDA probe."""

import json
from pathlib import Path

import pytest

import gpunb.analysis.checks.checklist as checks_module
from gpunb.analysis.checks.checklist import DeviceChoiceError, check
from gpunb.analysis.checks.pytorch import _arch_support, parse_alloc_conf
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.torch_build import KernelTorchState, TorchBuild
from gpunb.testing import replay_probe, scenario

PROBE = Path(__file__).parent / "data" / "h200_probe.jsonl"
H200_TORCH = TorchBuild(True, "2.11.0+cu130", "13.0", None, "/site-packages/torch")


@pytest.fixture
def h200_torch(monkeypatch):
    """The torch build and probe measurements recorded on the H200 test machine."""
    steps = []

    def fake_run_probe(*, environ, devices, timeout_s, on_step, owner=None):
        result = replay_probe(PROBE, on_step)
        steps.extend(result.results)
        return result

    monkeypatch.setattr(checks_module, "read_torch_build", lambda: H200_TORCH)
    monkeypatch.setattr(checks_module, "read_kernel_torch_state", lambda: None)  # this CPU torch is not it
    monkeypatch.setattr(checks_module, "run_probe", fake_run_probe)
    return steps


def run(name="h200", **kw):
    kw.setdefault("environ", {})
    kw.setdefault("in_kernel", False)
    return check(nvml=NvmlSession(scenario(name)), **kw)


def test_healthy_h200_has_no_failure(h200_torch):
    report = run()
    assert report.ok, [c.to_dict() for c in report.failed]
    assert report["driver"].status == "ok" and "NVIDIA H200" in report["driver"].summary
    assert report["torch_cuda"].status == "ok"
    assert report["torch_arch"].status == "ok" and "sm_90: native" in report["torch_arch"].summary
    assert report["cudnn_nccl"].summary == "cuDNN 9.19.0 · NCCL 2.28.9"
    assert "1.08 ms/step" in report["cuda_smoke"].summary
    assert "bf16 785 TFLOP/s (79% of 990 peak)" in report["matmul_throughput"].summary
    assert "TF32 ran 7.6x faster" in report["matmul_throughput"].tip
    assert "pinned 55.5 GB/s, pageable 7.3 GB/s" in report["h2d_bandwidth"].summary
    assert "63 GB/s theoretical" in report["h2d_bandwidth"].summary
    assert report.counts["fail"] == 0


def test_summary_line_counts_every_check(h200_torch):
    report = run()
    assert sum(report.counts.values()) == len(report.checks) == len(checks_module.CHECKS)
    second = str(report).splitlines()[1]  # under the finding: the counts
    assert second.startswith("gpunb check · ") and f"{report.counts['ok']} ok" in second


def test_progress_names_each_probe_step(h200_torch):
    seen = []
    report = run(progress=lambda partial: seen.append(partial.in_progress))
    assert any("smoke test on cuda:0" in (m or "") for m in seen)
    assert any("matrix-multiply" in (m or "") for m in seen)
    assert report.in_progress is None


def test_quick_skips_the_probe(h200_torch):
    report = run(quick=True)
    assert h200_torch == []  # the probe never ran
    assert report["cuda_smoke"].status == "skip" and "--quick" in report["cuda_smoke"].summary


def test_no_driver_on_a_laptop_is_skipped_unless_a_gpu_is_required():
    report = run("no-driver")
    assert report["driver"].status == "skip" and report["temperature"].status == "skip"
    assert report.ok and report.machine_state == "no_gpu"
    required = run("no-driver", require_gpu=True)
    assert required["driver"].status == "fail" and "nvidia-smi" in required["driver"].fix
    assert not required.ok


def test_no_driver_beside_an_nvidia_gpu_fails_with_the_driver_fix(monkeypatch):
    from gpunb.readings import pci
    monkeypatch.setenv(pci.FAKE_ENV, "1")
    report = run("no-driver")
    driver = report["driver"]
    assert driver.status == "fail" and report.machine_state == "no_driver"
    assert "libnvidia-ml.so.1" in driver.cause and "nvidia-smi" in driver.fix
    assert not report.ok


def test_lost_gpu_is_a_failure_naming_the_gpu():
    report = run("second-gpu-lost", quick=True)
    assert report["driver"].status == "fail" and "GPU1 fell off the bus" in report["driver"].cause


def test_other_process_is_named_and_escaped_in_html(h200_torch):
    fake = scenario("busy")
    fake.process_names[999_001] = "<script>alert(1)</script>"
    report = check(nvml=NvmlSession(fake), environ={}, in_kernel=False, quick=True)
    procs = report["gpu_processes"]
    assert procs.status == "warn" and "40.0 GiB" in procs.summary
    html = report._repr_mimebundle_()["text/html"]
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_unsupported_power_is_skipped_not_crashed():
    report = run("power-not-supported", quick=True)
    assert report["power"].status == "skip" and "not supported" in report["power"].summary


def test_device_selects_one_gpu_and_rejects_unknown(h200_torch):
    report = run("two-gpus", device=1, quick=True)
    assert report["temperature"].summary.startswith("GPU1:")
    with pytest.raises(DeviceChoiceError, match="device 5 does not exist"):
        run("two-gpus", device=5)


def test_empty_visible_devices_fails_and_skips_the_probe(h200_torch):
    report = run(environ={"CUDA_VISIBLE_DEVICES": ""})
    assert report["cuda_visible_devices"].status == "fail"
    assert h200_torch == []
    assert "CUDA sees no GPU" in report["cuda_smoke"].summary


def test_cpu_torch_with_a_gpu_fails_once(monkeypatch):
    monkeypatch.setattr(checks_module, "read_torch_build", lambda: TorchBuild(True, "2.13.0+cpu", None))
    report = run(quick=True)
    assert report["torch_cuda"].status == "fail"
    assert "CPU-only" in report["torch_cuda"].summary and "--index-url" in report["torch_cuda"].fix
    assert [c.id for c in report.failed] == ["torch_cuda"]


@pytest.mark.parametrize("driver_cuda, torch_cuda, status", [(12080, "13.0", "fail"), (13000, "13.1", "warn"),
                                                              (13000, "12.8", "ok")])
def test_driver_cuda_against_torch_cuda(monkeypatch, driver_cuda, torch_cuda, status):
    monkeypatch.setattr(checks_module, "read_torch_build", lambda: TorchBuild(True, "2.x", torch_cuda))
    fake = scenario("h200")
    fake.cuda_driver_version = driver_cuda
    report = check(nvml=NvmlSession(fake), environ={}, in_kernel=False, quick=True)
    assert report["torch_cuda"].status == status


def test_probe_failure_is_reported(monkeypatch):
    monkeypatch.setattr(checks_module, "read_torch_build", lambda: H200_TORCH)
    report = run(probe_timeout_s=0.01)  # the real probe subprocess, killed by the timeout
    assert report["cuda_smoke"].status == "fail"
    assert "did not finish within" in report["cuda_smoke"].cause


def test_real_probe_subprocess_on_this_machine():
    """The probe really runs here (CPU torch): it must report that CUDA is unusable, not crash."""
    report = run()
    assert report["torch_cuda"].status == "fail"  # a GPU (fake) with a CPU-only torch
    assert report["cuda_smoke"].status == "skip"


def test_kernel_cuda_state(monkeypatch):
    poisoned = KernelTorchState(None, None, None, "highest", True, "AcceleratorError: device-side assert triggered")
    monkeypatch.setattr(checks_module, "read_kernel_torch_state", lambda: poisoned)
    report = run(quick=True, in_kernel=True)
    assert report["kernel_cuda"].status == "fail" and "Restart the kernel" in report["kernel_cuda"].fix
    started = KernelTorchState(None, None, None, "high", True, None)
    monkeypatch.setattr(checks_module, "read_kernel_torch_state", lambda: started)
    report = run(quick=True, in_kernel=True)
    assert report["kernel_cuda"].status == "warn" and "forked subprocess" in report["kernel_cuda"].cause
    assert report["precision"].measured["matmul_precision"] == "high"


def test_alloc_conf_in_the_environment():
    report = run(quick=True, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"})
    assert report["alloc_conf"].status == "ok" and "expandable_segments=True" in report["alloc_conf"].summary
    report = run(quick=True, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"})
    assert report["alloc_conf"].status == "warn" and "unknown key 'expandable_segment'" in report["alloc_conf"].cause


def test_alloc_conf_parser_handles_lists():
    settings, problems = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6")
    assert settings == {"roundup_power2_divisions": "[256:1,512:2]", "garbage_collection_threshold": "0.6"}
    assert problems == []
    assert parse_alloc_conf("oops")[1] == ["'oops' has no ':' (expected key:value)"]


@pytest.mark.parametrize("arch, cc, expected", [
    (["sm_80", "sm_86", "sm_90"], (9, 0), "native"),
    (["sm_80"], (8, 9), "native"),  # same major, lower minor: binary compatible
    (["sm_80", "compute_80"], (9, 0), "ptx"),
    (["sm_75"], (9, 0), "none"),
    (["sm_90a"], (9, 0), "native"),
    (["sm_90a"], (10, 0), "none"),
    (["sm_100", "sm_120"], (12, 0), "native"),
])
def test_architecture_coverage(arch, cc, expected):
    assert _arch_support(arch, cc) == expected


def test_report_is_json_serialisable(h200_torch):
    data = json.loads(run().to_json())
    assert data["ok"] is True and data["summary"]["fail"] == 0
    assert {c["id"] for c in data["checks"]} >= {"driver", "cuda_smoke", "shm", "frameworks"}


def test_the_measured_matmul_peaks_are_kept_for_gpuprofile(h200_torch, private_peak_cache):
    from gpunb.readings import peak_cache

    run()
    kept = peak_cache.lookup("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff")
    assert kept.tflops == pytest.approx({"bf16": 784.872, "tf32": 387.786, "fp32": 50.774}, rel=1e-5)
    assert kept.name == "NVIDIA H200" and kept.torch_version == "2.11.0+cu130" and kept.this_process
    assert kept.copy_gbps == {"h2d": pytest.approx(55.507, rel=1e-4)}  # the PCIe limit line (recorded before D2H)
    assert "GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff" in json.loads(private_peak_cache.read_text())
    peak_cache.forget_this_process()
    run(quick=True)  # no probe: nothing new, the file still answers
    peaks = peak_cache.lookup("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff")
    assert peaks.tflops["bf16"] == pytest.approx(784.872, rel=1e-5)
