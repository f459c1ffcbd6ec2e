"""On a real GPU: each magic refuses a GPU that is not there with a UsageError (the CPU tests
can only fake the device count), ``%gpufit --device 0`` means ``cuda:0``, and a profiled
CUDA cell's report and traceback carry IPython's own ``In [n]``.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_magic_arguments_gpu.py -v
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("IPython")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpunb")
    yield shell
    shell.run_line_magic("unload_ext", "gpunb")  # stops any sampler the monitor test started


def test_a_gpu_past_the_last_one_fails_every_magic_that_takes_a_device(ip):
    from gpunb.readings.nvml import default_session

    cuda_count = torch.cuda.device_count()
    nvml_count = default_session().device_count()
    ip.user_ns["step"] = lambda batch_size: None
    for cell, words in (
        (f"%gpufit step --device cuda:{cuda_count}", f"no such GPU (allowed: cuda:0 to cuda:{cuda_count - 1}"),
        (f"%gpucheck --quick --device {cuda_count}", f"device {cuda_count} does not exist"),
        (f"%gpumonitor --device {nvml_count}", f"there is no GPU {nvml_count}"),
    ):
        with capture_output():
            result = ip.run_cell(cell)
        assert isinstance(result.error_in_exec, UsageError), cell
        assert words in str(result.error_in_exec), (cell, str(result.error_in_exec))


def test_gpufit_device_index_is_the_cuda_device(ip):
    ip.user_ns["torch"] = torch
    with capture_output():
        ip.run_cell("def step(batch_size):\n"
                    "    x = torch.randn(batch_size, 1024, device='cuda:0', requires_grad=True)\n"
                    "    (x * 2).sum().backward()\n")
        result = ip.run_cell("%gpufit step --device 0 --max-batch 64 -o _gpunb_fit")
    assert result.success
    fit = ip.user_ns.pop("_gpunb_fit")
    assert fit.ok, fit.problem
    assert fit.device == "cuda:0"


def test_a_profiled_cuda_cell_is_named_by_its_in_number(ip):
    ip.user_ns["torch"] = torch
    with capture_output() as out:
        ip.run_cell("_gpunb_w = torch.randn(1024, 1024, device='cuda')", store_history=True)
        result = ip.run_cell("%%gpuprofile -o _gpunb_prof\n"
                             "y = _gpunb_w @ _gpunb_w\n"
                             "raise ValueError(float(y.sum()))\n", store_history=True)
    n = result.execution_count
    text = ANSI.sub("", out.stdout + out.stderr + "".join(o.data.get("text/plain", "") for o in out.outputs))
    assert isinstance(result.error_in_exec, ValueError)
    profile = ip.user_ns.pop("_gpunb_prof")
    assert profile.cell == n and profile.gpu is not None
    assert f"gpuprofile In [{n}]:" in text and f"cell In [{n}] ·" in text and f"Cell In[{n}], line 3" in text
    ip.user_ns.pop("_gpunb_w", None)
