"""Slow is not absent: an nvmlInit that is slow (a driver without persistence mode: 0.2-2 s)
and already running on another thread (a prewarm right after ``%load_ext``) is waited for
within its window and the caller's budget; past it the answer is "slow", never "no driver".

The class: every caller that meets an nvmlInit in flight (``NvmlSession.start`` and each
read, through ``_wait_for_init``). Generated cases: seeded init delays from 0 to 3 s (plus
the edges) crossed with the callers %gpucheck --quick, %gpumem, gpunb.memory() and the CLI's check.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

import gpunb
from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import INIT_WAIT_S, NvmlSession
from gpunb.testing import scenario

_rng = random.Random(30)
DELAYS = sorted({0.0, 0.3, INIT_WAIT_S + 0.6, 3.0, *(round(_rng.uniform(0.0, 3.0), 2) for _ in range(2))})
NO_DRIVER_WORDS = ("no NVIDIA driver", "driver is not loaded", "no NVIDIA driver is installed", "NVML unavailable",
                   "still starting")


def _gpucheck(ip, capsys) -> str:
    ip.run_line_magic("gpucheck", "--quick")
    return capsys.readouterr().out


def _gpumem(ip, capsys) -> str:
    ip.run_line_magic("gpumem", "")
    return capsys.readouterr().out


def _memory(ip, capsys) -> str:
    report = gpunb.memory()
    return "\n".join([*(f"GPU {g.index} {g.name}" for g in report.gpus), *report.problems])


def _cli(ip, capsys) -> str:
    from gpunb.cli import main

    rc = main(["check", "--quick"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # 1 is a real problem found (here: a CPU-only torch), never a crash
    return out


CALLERS = {"%gpucheck --quick": _gpucheck, "%gpumem": _gpumem, "gpunb.memory()": _memory, "CLI check --quick": _cli}


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("delay", DELAYS)
def test_an_init_in_flight_is_waited_for_then_said_as_slow_never_as_no_driver(ip, capsys, caller, delay):
    fake = scenario("h200")
    fake.hangs["nvmlInit"] = delay
    session = NvmlSession(fake)
    nvml_module.set_default_session(session)
    prewarm = threading.Thread(target=session.start, daemon=True)
    try:
        prewarm.start()
        time.sleep(0.05)  # the init is in flight on the prewarm thread
        t0 = time.monotonic()
        out = CALLERS[caller](ip, capsys)
        took = time.monotonic() - t0
        for words in NO_DRIVER_WORDS[:4]:
            assert words not in out, out
        if delay < INIT_WAIT_S - 0.3:  # in time: the real answer, the GPU read
            assert "slow to answer" not in out and ("H200" in out or "GPU0" in out or "GPU 0" in out), out
        elif delay > INIT_WAIT_S + 0.3:  # too slow: said as slow, and the cell did not wait for it all
            assert "slow to answer" in out, out
            assert took < INIT_WAIT_S + 0.8
    finally:
        fake.release_hangs()
        prewarm.join(5)
        session.stop_worker()
        nvml_module.set_default_session(None)
