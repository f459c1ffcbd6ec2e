"""Exceptions that are not ``Exception`` (``asyncio.CancelledError``, a ``KeyboardInterrupt``
raised by an object) coming out of the user's objects while gpunb runs inside the cell or
after it: the OOM doctor, the census, the profile's end, the one-line meter.

Before: a namespace object raising ``CancelledError`` on attribute access after an OOM made
the cell's reply never come (120 s in a real kernel; in-process, ``run_cell`` raised) and the
pinned memory stayed pinned; an exception whose ``__str__`` raised got "the profile could
not be built ... report this to gpunb".
"""

from __future__ import annotations

import pytest

from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from tests.test_fault_injection import run

torch = pytest.importorskip("torch")

HOSTILE = '''
import asyncio, weakref

class Cancelling:
    """Every attribute access raises CancelledError (a BaseException), __class__ included."""
    def __getattribute__(self, name):
        raise asyncio.CancelledError(f"cancelled while reading {name}")

class Interrupting:
    def __getattr__(self, name):
        raise KeyboardInterrupt(f"interrupted reading {name}")
    def __len__(self):
        raise KeyboardInterrupt("len")

class Exiting(dict):
    def items(self):
        raise SystemExit("items")

cancel = Cancelling()
interrupt = Interrupting()
exiting = Exiting(a=torch.zeros(4))
kept = torch.zeros(8, 8)
'''

OOM_CELL = '''
def step(bs):
    acts = torch.zeros(bs, 32)
    globals()["_probe"] = weakref.ref(acts)
    raise torch.OutOfMemoryError(_gpunb_test["msg"])
step(64)
'''


@pytest.fixture
def shell(ip):
    ip.reset(new_session=False)
    nvml_module.set_default_session(NvmlSession(scenario("h200")))
    ip.user_ns["_gpunb_test"] = {"msg": load_trace()["oom_message"]}
    run(ip, "import torch, gpunb")
    run(ip, HOSTILE)
    yield ip
    run(ip, "%gpuprofile off")
    nvml_module.set_default_session(None)


def test_the_oom_doctor_survives_objects_raising_base_exceptions_and_frees_the_memory(shell):
    result, out = run(shell, OOM_CELL, user_error=True)  # run_cell returned: the reply goes out
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert "gpunb OOM doctor" in out and "could not diagnose" not in out, out[-2000:]
    assert shell.user_ns["_probe"]() is None, "the failed cell's frames still pin its tensors"


def test_the_census_and_free_survive_them(shell):
    _, out = run(shell, "%gpumem --all-devices")
    assert "kept" in out and "names skipped" in out
    run(shell, "%gpumem --free kept")
    assert "kept" not in shell.user_ns


def test_the_one_line_meter_and_the_doctor_together(shell):
    run(shell, "%gpuprofile on")
    _, out = run(shell, OOM_CELL, user_error=True)
    assert "gpunb OOM doctor" in out
    _, out = run(shell, "x = cancel")
    assert "s" in out  # the one-line summary still comes


@pytest.mark.parametrize("raised", ["RuntimeError", "asyncio.CancelledError"])
def test_an_exception_whose_str_raises_gets_its_profile(shell, raised):
    run(shell, f"class BadStr(Exception):\n    def __str__(self):\n        raise {raised}('str')")
    result, out = run(shell, "%%gpuprofile --no-flops\nx = torch.ones(4) @ torch.ones(4)\nraise BadStr()",
                      user_error=True)
    assert "could not be built" not in out and "report this" not in out.lower(), out[-2000:]
    assert "BadStr (its message could not be read" in out, out[-3000:]
    if raised == "RuntimeError":  # (IPython itself turns a CancelledError from __str__ into the cell's error)
        assert type(result.error_in_exec).__name__ == "BadStr"
