"""%gpucheck in an in-process IPython shell, and the `gpunb check` command line."""

import json
import os
import subprocess
import sys

import pytest
from IPython.utils.capture import capture_output

from gpunb.analysis.checks.records import CheckReport


def shown(out):
    """Everything the user would see: printed text and displayed objects' text."""
    return out.stdout + out.stderr + "".join(o.data.get("text/plain", "") for o in out.outputs)


def test_quick_check_prints_the_report(ip, fake_nvml):
    with capture_output() as out:
        ip.run_line_magic("gpucheck", "--quick")
    text = shown(out)
    # the finding first (the fake H200 beside this machine's CPU torch), then the counts
    assert text.startswith("torch ") and "is a CPU-only build: every model trains on the CPU" in text.splitlines()[0]
    assert text.splitlines()[1].startswith("gpunb check · 1 problem · ")
    assert "text/html" in out.outputs[-1].data  # notebooks get the HTML checklist
    assert "NVIDIA driver sees the GPUs" in text and "NVIDIA H200" in text


def test_output_binds_the_report(ip, fake_nvml):
    with capture_output():
        ip.run_line_magic("gpucheck", "--quick -o rep")
    report = ip.user_ns.pop("rep")
    assert isinstance(report, CheckReport) and report["driver"].status == "ok"


def test_json_output_is_machine_readable(ip, fake_nvml):
    with capture_output() as out:
        ip.run_line_magic("gpucheck", "--quick --json")
    data = json.loads(out.stdout)
    assert data["quick"] is True and data["checks"][0]["id"] == "driver"


@pytest.mark.parametrize("line, message", [
    ("--bogus", "unrecognized arguments: --bogus"),
    ("--device x", "'x' is not a whole number (allowed: 0 or more)"),
    ("--device 7", "device 7 does not exist"),
    ("-o 1abc", "'1abc' is not a Python variable name"),
])
def test_bad_input_is_a_usage_message_not_a_traceback(ip, fake_nvml, line, message):
    with capture_output() as out:
        result = ip.run_cell(f"%gpucheck --quick {line}")
    text = shown(out)
    assert not result.success
    assert "UsageError" in text and message in text
    assert "Traceback" not in text


def test_help_is_the_docstring(ip):
    doc = ip.find_line_magic("gpucheck").__doc__
    assert "--quick" in doc and "--device N" in doc and "gpunb.check()" in doc


def test_unload_removes_the_magic(ip):
    ip.run_line_magic("unload_ext", "gpunb")
    assert ip.find_line_magic("gpucheck") is None
    ip.run_line_magic("load_ext", "gpunb")  # the fixture unloads again
    assert ip.find_line_magic("gpucheck") is not None


def _cli(*args, scenario="h200"):
    env = dict(os.environ, GPUNB_FAKE_NVML=scenario)
    return subprocess.run([sys.executable, "-m", "gpunb", "check", *args], capture_output=True, text=True, env=env)


def test_cli_exit_code_follows_failures():
    healthy_fake_but_cpu_torch = _cli("--quick")  # a GPU without a CUDA torch build: that check fails
    assert healthy_fake_but_cpu_torch.returncode == 1
    assert "is a CPU-only build: every model trains on the CPU — torch is a CUDA build" in \
        healthy_fake_but_cpu_torch.stdout
    laptop = _cli("--quick", "--json", scenario="no-driver")  # no GPU is a laptop's state, not a failure
    assert laptop.returncode == 0 and json.loads(laptop.stdout)["checks"][0]["status"] == "skip"
    required = _cli("--quick", "--json", "--require-gpu", scenario="no-driver")
    assert required.returncode == 1 and json.loads(required.stdout)["checks"][0]["status"] == "fail"


def test_cli_bad_arguments_exit_2():
    assert _cli("--bogus").returncode == 2
    wrong_device = _cli("--device", "3")
    assert wrong_device.returncode == 2 and "device 3 does not exist" in wrong_device.stderr
