"""Issue 28: on the real GPU machine, the machine's one statement says "GPUs visible", the PCI
bus is read as holding NVIDIA GPUs, and the check run's verdict agrees in every form.

    python -m pytest -m gpu tests/gpu/test_machine_gpu.py -v
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from gpunb.analysis.machine import machine_of  # noqa: E402
from gpunb.readings import pci  # noqa: E402
from gpunb.readings.nvml import default_session  # noqa: E402


def test_the_machine_is_said_to_have_its_gpus():
    assert pci.nvidia_gpu_on_bus() is True  # the real sysfs, no driver needed
    said = machine_of(default_session())
    assert said.state == "gpus" and said.severity == "info" and said.fix == ""
    assert said.sentence.startswith(f"{torch.cuda.device_count()} NVIDIA GPU")


def test_gpunb_check_json_and_exit_code_agree_on_the_gpu_machine():
    done = subprocess.run([sys.executable, "-m", "gpunb", "check", "--quick", "--json", "--require-gpu"],
                          capture_output=True, text=True, timeout=300)
    data = json.loads(done.stdout)
    assert data["machine"] == "gpus" and data["checks"][0]["status"] != "skip"
    assert data["ok"] == (data["summary"]["fail"] == 0) and done.returncode == (0 if data["ok"] else 1)
