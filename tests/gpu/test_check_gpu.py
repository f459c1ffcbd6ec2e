"""%gpucheck on a real GPU: every check runs for real and a healthy GPU reports no failure.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_check_gpu.py -v
Each report is written as JSON into $GPUNB_RESULTS (default: a temp dir).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import gpunb  # noqa: E402
from tests.gpu.results import RESULTS  # noqa: E402


def _save(name: str, report) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"check_{name}.json").write_text(report.to_json())
    (RESULTS / f"check_{name}.txt").write_text(str(report))


def test_full_check_on_a_healthy_gpu_has_no_failure():
    report = gpunb.check(in_kernel=False)
    _save("full", report)
    assert report.ok, "\n".join(f"{c.id}: {c.summary} / {c.cause}" for c in report.failed)
    smoke = report["cuda_smoke"].measured
    figures = next(iter(smoke.values()))
    assert figures["loss_finite"] and figures["params_on_gpu"] and 0 < figures["step_ms_median"] < 100
    matmul = next(iter(report["matmul_throughput"].measured.values()))
    assert matmul["bf16_tflops"] > 50 and matmul["tf32_tflops"] > matmul["fp32_tflops"]
    copy = next(iter(report["h2d_bandwidth"].measured.values()))
    assert copy["pinned_gbps"] > 1


def test_the_probe_leaves_this_process_without_a_cuda_context():
    if torch.cuda.is_initialized():  # an earlier test file in this pytest process used the GPU
        pytest.skip("CUDA was already initialized in this process: run this file first (gpu-box-run.sh does)")
    report = gpunb.check(in_kernel=True)
    assert not torch.cuda.is_initialized()  # the measurements ran in the child
    assert report["kernel_cuda"].status == "ok"


def test_device_and_visible_devices_select_by_uuid():
    uuid = gpunb.check(quick=True)["driver"].measured["gpus"][0]["uuid"]
    report = gpunb.check(device=0, environ={**os.environ, "CUDA_VISIBLE_DEVICES": uuid}, in_kernel=False)
    _save("by_uuid", report)
    assert report["cuda_visible_devices"].status == "ok"
    assert report["cuda_smoke"].status == "ok"
    hidden = gpunb.check(environ={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, in_kernel=False)
    assert hidden["cuda_visible_devices"].status == "fail"


def _in_subprocess(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cuda_initialized_in_the_kernel_is_reported():
    data = _in_subprocess("""
        import json, torch, gpunb
        torch.ones(1, device="cuda")
        r = gpunb.check(quick=True, in_kernel=True)
        print(json.dumps(r["kernel_cuda"].to_dict()))
    """)
    assert data["status"] == "warn" and "forked subprocess" in data["cause"]


def test_poisoned_context_after_a_device_side_assert():
    data = _in_subprocess("""
        import json, torch, gpunb
        a = torch.zeros(3, device="cuda")
        try:
            a[torch.tensor([5], device="cuda")] += 1   # out of bounds: device-side assert
            torch.cuda.synchronize()
        except Exception:
            pass
        r = gpunb.check(quick=True, in_kernel=True)
        print(json.dumps(r["kernel_cuda"].to_dict()))
    """)
    assert data["status"] == "fail" and "Restart the kernel" in data["fix"]
    (RESULTS / "check_poisoned.json").write_text(json.dumps(data, indent=2))


def test_magic_in_ipython_on_the_gpu():
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    try:
        with capture_output() as out:
            ip.run_line_magic("gpucheck", "--quick -o rep")
        report = ip.user_ns["rep"]
        assert report["driver"].status == "ok"
        assert "NVIDIA" in "".join(o.data.get("text/plain", "") for o in out.outputs)
    finally:
        ip.run_line_magic("unload_ext", "gpunb")
