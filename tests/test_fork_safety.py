"""No gpunb path in the kernel starts CUDA or poisons fork (issue 10): proven with spies.

On two H200s ``accelerate.notebook_launcher`` failed with "Cannot re-initialize CUDA in forked
subprocess" after ``gpunb.check(quick=True)``, though CUDA was never initialized: torch's C++
getters behind ``torch._C._cuda_getArchFlags()`` and ``_cuda_getDeviceCount()`` call
``poison_fork()`` (torch/csrc/cuda/Module.cpp). Here every such torch entry point records who
called it, torch is made to look like a CUDA build with CUDA not yet initialized, NVML shows
two recorded H200s, and every gpunb feature runs in an IPython shell. None may call them; only
``%gpufit``, which the user runs to do CUDA work, does (the control that the spies see calls).
The same on real GPUs, followed by a real ``notebook_launcher``: tests/gpu/test_fork_safety_gpu.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpunb.readings import nvml as nvml_module  # noqa: E402
from gpunb.readings.nvml import NvmlSession  # noqa: E402
from gpunb.testing import load_trace, replay_probe, scenario  # noqa: E402

PROBE = Path(__file__).parent / "data" / "h200_probe.jsonl"

# (module, attribute): what starts CUDA, poisons fork, or reads a device before CUDA is up.
ENTRY_POINTS = [
    ("torch._C", "_cuda_getArchFlags"),
    ("torch._C", "_cuda_getDeviceCount"),
    ("torch._C", "_cuda_init"),
    ("torch._C", "_cuda_getDevice"),
    ("torch._C", "_cuda_setDevice"),
    ("torch._C", "_cuda_memoryStats"),
    ("torch._C", "_cuda_resetPeakMemoryStats"),
    ("torch._C", "_cuda_emptyCache"),
    ("torch._C", "_cuda_synchronize"),
    ("torch.cuda", "_lazy_init"),
    ("torch.cuda", "init"),
    ("torch.cuda", "is_available"),
    ("torch.cuda", "device_count"),
    ("torch.cuda", "current_device"),
    ("torch.cuda", "set_device"),
    ("torch.cuda", "get_device_properties"),
    ("torch.cuda", "get_device_name"),
    ("torch.cuda", "get_device_capability"),
    ("torch.cuda", "get_arch_list"),
    ("torch.cuda", "mem_get_info"),
    ("torch.cuda", "synchronize"),
    ("torch.cuda", "reset_peak_memory_stats"),
    ("torch.cuda", "empty_cache"),
    ("torch.cuda", "Event"),
    ("torch.backends.cudnn", "version"),
    ("torch.cuda.nccl", "version"),
]


CUDA_BUILD_ANSWERS = {"torch._C._cuda_getArchFlags": "sm_80 sm_90 sm_100"}


def _caller() -> str:
    """The module of the first frame outside torch and this spy: who asked."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != __name__ and not name.startswith("torch"):
            return name
        frame = frame.f_back
    return "?"


@pytest.fixture
def spies(monkeypatch):
    """Every entry point records (entry point, calling module), then does what it did before."""
    import importlib

    calls: list[tuple[str, str]] = []
    for module_name, attr in ENTRY_POINTS:
        module = importlib.import_module(module_name)
        original = getattr(module, attr, None)
        if original is None and attr == "_cuda_getDeviceCount":
            # its presence is torch's own "compiled with CUDA" test: adding it to this CPU build
            # would break torch; device_count()/is_available(), which call it, are spied
            continue

        def spy(*args, _name=f"{module_name}.{attr}", _original=original, **kwargs):
            calls.append((_name, _caller()))
            if _original is None:  # not in this CPU build: answer like a CUDA build would, so the caller goes on
                return CUDA_BUILD_ANSWERS.get(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, attr, spy, raising=False)
    # a CUDA build whose CUDA is not initialized yet, as in the kernel that failed on the H200s
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    return calls


@pytest.fixture
def two_h200s(monkeypatch):
    nvml_module.set_default_session(NvmlSession(scenario("two-gpus")))
    import gpunb.analysis.checks.checklist as checks_module

    # the full check's CUDA measurements run in a subprocess; here they replay the H200's
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: replay_probe(PROBE, kw.get("on_step")))
    yield
    nvml_module.set_default_session(None)


def from_gpunb(calls):
    return [c for c in calls if c[1].split(".")[0] == "gpunb"]


def test_no_gpunb_path_in_the_kernel_touches_cuda(spies, two_h200s, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.user_ns["_gpunb_test"] = {"msg": load_trace()["oom_message"]}
    try:
        ip.run_line_magic("load_ext", "gpunb")
        ip.run_line_magic("gpucheck", "--quick")
        ip.run_line_magic("gpucheck", "")
        ip.run_line_magic("gpucheck", "--deep")  # the all-reduce ranks are subprocesses (gloo here)
        ip.run_line_magic("gpumonitor", "--hz 10")
        ip.run_cell("import time; time.sleep(0.35)")  # the sampler thread ticks while a cell runs
        ip.run_cell_magic("gpuprofile", "", (
            "import torch\n"
            "model = torch.nn.Linear(16, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16)), batch_size=8)\n"
            "for (x,) in data:\n"
            "    loss = model(x).pow(2).mean()\n"
            "    loss.backward(); opt.step(); opt.zero_grad()\n"
            "print(loss.item())\n"))
        ip.run_line_magic("gpuprofile", "on")
        ip.run_cell("y = model(torch.randn(4, 16)).sum().item()")
        ip.run_line_magic("gpuprofile", "off")
        ip.run_line_magic("gpuprofile", "history")
        ip.run_line_magic("gpumem", "")
        ip.run_cell("def train_step(bs):\n"
                    "    acts = torch.zeros(bs, 64)\n"
                    "    raise torch.OutOfMemoryError(_gpunb_test['msg'])\n"
                    "train_step(256)")
        ip.run_line_magic("gpumem", "--release")
        ip.run_cell("import gpunb\ntry:\n    train_step(8)\nexcept torch.OutOfMemoryError as e:\n"
                    "    _gpunb_test['d'] = gpunb.diagnose_oom(e)")
        ip.run_line_magic("gpumonitor", "--stop")
    finally:
        ip.run_line_magic("unload_ext", "gpunb")
    out = capsys.readouterr().out
    # every feature ran and said something (a test that ran nothing would pass trivially)
    for seen in ("gpunb check", "cuDNN 9.19.0", "--deep", "2 ranks over gloo", "GPU1 NVIDIA H200: util",
                 "8 optimizer steps", "one line after",
                 "gpunb memory", "gpunb OOM doctor", "released", "stopped 1 monitor"):
        assert seen.lower() in out.lower(), (seen, out[-3000:])
    assert ip.user_ns["_gpunb_test"]["d"].primary_cause
    assert from_gpunb(spies) == [], from_gpunb(spies)


def test_the_spies_see_a_gpunb_call_when_the_user_asks_for_cuda_work(spies, two_h200s):
    """%gpufit runs the user's CUDA training step: asking torch about CUDA is its job."""
    import gpunb

    fit = gpunb.fit_batch_size(lambda bs: None, progress=False)
    assert not fit.ok and "torch sees none" in fit.problem  # this CPU torch has no CUDA device
    assert ("torch.cuda.is_available", "gpunb.analysis.fit.search") in spies
