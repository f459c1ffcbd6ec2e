"""One statement of the machine (gpunb.analysis.machine), said the same way by every surface.

Every state the fake NVML, the PCI bus and this machine's CPU torch can put together, times
every surface that has to say it: the checklist (view, JSON, CLI), %gpumonitor, %gpuenergy,
%gpumem and %%gpumem --trace. Each must show the state's one sentence, and a laptop must never
be told to install a driver or start Docker with --gpus all.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys

import pytest
from IPython.utils.capture import capture_output

from gpunb.analysis import machine
from gpunb.analysis.machine import STATES, MachineStatement, state_of
from gpunb.readings import nvml as nvml_module
from gpunb.readings import pci
from gpunb.readings.nvml import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, TIMEOUT, NvmlStatus
from gpunb.readings.torch_build import TorchBuild, read_torch_build

DRIVER_ADVICE = ("--gpus all", "Install the NVIDIA driver", "modprobe", "container toolkit")
CPU_TORCH = TorchBuild(True, "2.9.0+cpu")
CUDA_TORCH = TorchBuild(True, "2.9.0+cu128", cuda="12.8")
NO_TORCH = TorchBuild(False)
LIB_MISSING = NvmlStatus(False, "libnvidia-ml.so.1 was not found", "install it", LIBRARY_NOT_FOUND)


# -- the decision: every state reachable, each with one sentence, severity and fitting fix ----

@pytest.mark.parametrize(("nvml", "count", "torch", "bus", "state", "severity"), [
    (LIB_MISSING, None, CPU_TORCH, False, "no_gpu", "info"),
    (LIB_MISSING, None, NO_TORCH, None, "no_gpu", "info"),  # no /sys to look at: not told to install
    (LIB_MISSING, None, CUDA_TORCH, True, "no_driver", "fail"),
    (NvmlStatus(False, "not loaded", "", DRIVER_NOT_LOADED), None, CPU_TORCH, True, "no_driver", "fail"),
    (NvmlStatus(False, "slow", "wait", TIMEOUT), None, CUDA_TORCH, True, "nvml_slow", "warn"),
    (NvmlStatus(True), 2, NO_TORCH, True, "no_torch", "warn"),
    (NvmlStatus(True), 2, CPU_TORCH, True, "cpu_torch", "fail"),
    (NvmlStatus(True), 8, CUDA_TORCH, True, "gpus", "info"),
])
def test_each_state_has_one_sentence_severity_and_the_fix_that_fits(nvml, count, torch, bus, state, severity):
    said = state_of(nvml, count, torch, bus, "12.8")
    assert (said.state, said.severity) == (state, severity) and said.sentence
    if state == "no_gpu":
        assert said.fix == "" and not any(a in said.text() for a in DRIVER_ADVICE)  # a laptop is fine
    if state == "no_driver":
        assert "nvidia-smi" in said.fix
    if state in ("cpu_torch", "no_torch"):  # the exact install command for this driver's CUDA
        assert "--index-url https://download.pytorch.org/whl/cu128" in said.fix


def test_every_state_is_covered_above():
    assert set(STATES) == {"no_gpu", "no_driver", "nvml_slow", "no_torch", "cpu_torch", "gpus"}


# -- the surfaces ------------------------------------------------------------------------------

def _shown(ip, cell: str) -> str:
    """What a cell showed: stdout, stderr and each output's text and HTML, HTML unescaped."""
    with capture_output() as out:
        result = ip.run_cell(cell)
    assert result.error_in_exec is None, result.error_in_exec
    parts = [out.stdout, out.stderr]
    for o in out.outputs:
        parts += [o.data.get("text/plain", ""), html.unescape(o.data.get("text/html", ""))]
    return _plain("\n".join(parts))


def _plain(text: str) -> str:
    """Tags, backticks (code spans) and line wrapping taken out: the words as read."""
    return " ".join(re.sub(r"<[^>]+>|`", " ", text).split()).replace(" .", ".")


def _cli(scenario_name: str, bus: str) -> dict:
    env = dict(os.environ, GPUNB_FAKE_NVML=scenario_name, **{pci.FAKE_ENV: bus})
    done = subprocess.run([sys.executable, "-m", "gpunb", "check", "--quick", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    return {"rc": done.returncode, **json.loads(done.stdout)}


def _expected(monkeypatch, bus: str) -> MachineStatement:
    monkeypatch.setenv(pci.FAKE_ENV, bus)
    return machine.machine_of(nvml_module.default_session())


@pytest.mark.parametrize(("fake_nvml", "bus", "state"), [("no-driver", "0", "no_gpu"), ("no-driver", "1", "no_driver")],
                         indirect=["fake_nvml"])
def test_without_a_usable_gpu_every_surface_says_the_same_sentence(ip, fake_nvml, monkeypatch, bus, state):
    said = _expected(monkeypatch, bus)
    assert said.state == state
    ip.run_cell("import torch")
    surfaces = {
        "%gpucheck": _shown(ip, "%gpucheck --quick"),
        "%gpumonitor": _shown(ip, "%gpumonitor"),
        "%gpuenergy": _shown(ip, "%gpuenergy"),
        "%gpumem": _shown(ip, "%gpumem"),
        "%%gpumem --trace": _shown(ip, "%%gpumem --trace\nx = torch.ones(3)"),
    }
    _shown(ip, "%gpumonitor --stop")
    for surface, text in surfaces.items():
        assert _plain(said.sentence) in text, f"{surface} does not say {said.sentence!r}:\n{text}"
        if state == "no_gpu":
            assert not any(a in text for a in DRIVER_ADVICE), f"{surface} tells a laptop to install a driver"
        else:
            assert _plain(said.fix) in text, f"{surface} leaves out the fix {said.fix!r}:\n{text}"
    cli = _cli("no-driver", bus)
    assert cli["machine"] == state and cli["checks"][0]["measured"]["machine"]["severity"] == said.severity
    assert cli["checks"][0]["summary"] == said.sentence
    assert cli["rc"] == (0 if said.severity == "info" else 1)


@pytest.mark.skipif(not read_torch_build().installed or read_torch_build().cuda is not None,
                    reason="needs this machine's CPU-only torch")
@pytest.mark.parametrize("fake_nvml", ["two-gpus"], indirect=True)
def test_cpu_torch_beside_gpus_is_said_with_the_install_command(ip, fake_nvml, monkeypatch):
    said = _expected(monkeypatch, "1")
    assert said.state == "cpu_torch" and "pip install" in said.fix
    ip.run_cell("import torch")
    for surface, cell in {"%gpucheck": "%gpucheck --quick", "%gpumem": "%gpumem",
                          "%%gpumem --trace": "%%gpumem --trace\nx = torch.ones(3)"}.items():
        text = _shown(ip, cell)
        assert _plain(said.sentence) in text and _plain(said.fix) in text, f"{surface}:\n{text}"
