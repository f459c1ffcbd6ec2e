"""Shared fixtures: an in-process IPython shell and the fake NVML from real H200 readings."""

from __future__ import annotations

import IPython
import pytest

from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario


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
def ip():
    """A fresh in-process IPython shell with gpunb loaded; unloaded afterwards."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpunb")
    yield shell
    shell.run_line_magic("unload_ext", "gpunb")
    shell.user_ns.pop("_gpunb_test", None)
