"""Shared fixtures: an in-process IPython shell and the fake NVML from real H200 readings."""

from __future__ import annotations

import IPython
import pytest

from gpunb.readings import nvml as nvml_module
from gpunb.readings import peak_cache
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import replay_clock, scenario


def pytest_report_header() -> str:
    return f"IPython {IPython.__version__}"  # the cell-number tests run on IPython 8 and 9


@pytest.fixture
def fake_nvml(request):
    """Install a fake NVML scenario as the process-wide session.

    Use ``@pytest.mark.parametrize("fake_nvml", ["two-gpus"], indirect=True)`` for others;
    the default is the healthy recorded H200. Yields the ``FakePynvml`` object.
    """
    name = getattr(request, "param", "h200")
    fake = scenario(name)
    nvml_module.set_default_session(NvmlSession(fake))
    yield fake
    nvml_module.set_default_session(None)


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA up on the recorded H200 (``tests/simulated_cuda.py``), NVML replaying the recording
    in real time from 16 s on: training, util 98-100 %, its PID 412 named as this process."""
    import os

    from gpunb.readings import torch_state
    from tests.simulated_cuda import SimulatedTorch, recorded_h200_cuda

    fake = scenario("h200", clock=replay_clock(16.0))
    fake.gpus[0].pid_map = {412: os.getpid()}
    nvml_module.set_default_session(NvmlSession(fake))
    cuda = recorded_h200_cuda()
    proxy = SimulatedTorch(cuda)
    monkeypatch.setattr(torch_state, "imported_torch", lambda: proxy)
    yield cuda
    nvml_module.set_default_session(None)


@pytest.fixture
def ip():
    """A fresh in-process IPython shell with gpunb loaded; unloaded afterwards."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpunb")
    yield shell
    shell.run_line_magic("unload_ext", "gpunb")
    shell.user_ns.pop("_gpunb_test", None)


@pytest.fixture(autouse=True)
def private_peak_cache(tmp_path_factory, monkeypatch):
    """Matmul peaks a test's check measures (recorded probes) go to a private file, never to
    the developer's ~/.cache, and are forgotten after the test."""
    path = tmp_path_factory.getbasetemp() / "gpunb-cache" / peak_cache.FILE_NAME
    monkeypatch.setattr(peak_cache, "cache_file", lambda environ=None: path)
    yield path
    peak_cache.forget_this_process()
    path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def laptop_bus(request, monkeypatch):
    """The fake NVML's "no-driver" is a laptop: no NVIDIA device on the PCI bus, whatever the
    machine running the tests has (the H200 box has eight). Tests marked ``gpu`` read the real bus."""
    if request.node.get_closest_marker("gpu") is None:
        from gpunb.readings import pci
        monkeypatch.setenv(pci.FAKE_ENV, "0")  # subprocesses (gpunb check) inherit it


def pytest_addoption(parser) -> None:
    parser.addoption("--repeat", type=int, default=1, metavar="N",
                     help="run every collected test N times (CI repeats the deadline and lifecycle "
                          "tests so a new race shows up before a landing; pytest-repeat is not installed)")


def pytest_generate_tests(metafunc) -> None:
    n = metafunc.config.getoption("repeat")
    if n > 1:
        metafunc.fixturenames.append("_repeat_index")
        metafunc.parametrize("_repeat_index", range(n), ids=lambda i: f"run{i + 1}")
