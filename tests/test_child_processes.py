"""Every process gpunb starts ends with the cell that started it: the CUDA probe and what it
started in turn (its process group), at every stage a Ctrl-C, the Cancel button's kernel
interrupt or an exception can reach.

The probe here is a stand-in script (the real one needs a GPU and seconds of torch import):
it starts a grandchild, reports each stage on stdout as the real probe does, and sleeps as
a probe on a busy GPU would. Each test asserts the child and the grandchild are gone.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import threading
import time

import pytest

from gpunb.readings import cuda_probe
from gpunb.readings.children import live_children
from gpunb.readings.transaction import Transaction, open_transactions
from tests.line_injector import LineInjector

SLOW_PROBE = """\
import json, os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.environ["PIDS_FILE"], "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
for step in ("import torch", "cuda init", "matmul"):
    print(json.dumps({"event": "step", "step": step, "device": 0}), flush=True)
    time.sleep(float(os.environ.get("STEP_S", "20")))
print(json.dumps({"event": "done"}), flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running: reaped by its parent (or init) soon
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone(pids: list[int], within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def slow_probe(tmp_path, monkeypatch):
    """The probe script replaced by the slow stand-in; returns a reader of its two pids."""
    script = tmp_path / "slow_probe.py"
    script.write_text(SLOW_PROBE)
    pids_file = tmp_path / "pids"
    monkeypatch.setattr(cuda_probe, "SCRIPT", script)
    monkeypatch.setenv("PIDS_FILE", str(pids_file))

    def pids() -> list[int]:
        deadline = time.monotonic() + 10
        while not pids_file.exists() or not pids_file.read_text().strip():
            assert time.monotonic() < deadline, "the stand-in probe never started"
            time.sleep(0.02)
        return [int(p) for p in pids_file.read_text().split()]

    yield pids
    assert not live_children(), f"children left running: {live_children()}"


def test_closing_the_owner_ends_a_probe_running_in_another_thread(slow_probe):
    owner = Transaction("test")
    box = {}
    runner = threading.Thread(target=lambda: box.update(r=cuda_probe.run_probe(owner=owner)))
    runner.start()
    pids = slow_probe()
    t0 = time.monotonic()
    owner.close()
    runner.join(5)
    assert not runner.is_alive() and time.monotonic() - t0 < 5
    assert gone(pids), "the probe or its grandchild outlived the check"
    assert "stopped" in box["r"].error


@pytest.mark.parametrize("stage", ["import torch", "cuda init", "matmul"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError, RuntimeError])
def test_an_exception_at_each_stage_ends_the_process_group(slow_probe, monkeypatch, stage, exc):
    monkeypatch.setenv("STEP_S", "0.2")

    def on_step(step, device):
        if step == stage:
            raise exc("stopped at " + stage)

    with pytest.raises(exc):
        cuda_probe.run_probe(on_step=on_step)
    assert gone(slow_probe())


def test_a_ctrl_c_at_every_line_of_run_probe_ends_the_process_group(slow_probe, monkeypatch):
    monkeypatch.setenv("STEP_S", "0.05")
    recorder = LineInjector()
    with recorder:
        cuda_probe.run_probe(timeout_s=30)
    points = recorder.points
    assert len(points) > 15
    fired = 0
    for point in points:
        injector = LineInjector(at=point)
        try:
            with injector:
                cuda_probe.run_probe(timeout_s=30)
        except KeyboardInterrupt:
            pass
        fired += injector.fired
        assert gone(slow_probe()), f"the probe outlived a Ctrl-C at {injector.where}"
        assert not open_transactions()
    assert fired >= len(points) * 0.9


def test_a_kernel_interrupt_in_gpucheck_ends_the_probe(ip, fake_nvml, slow_probe, monkeypatch):
    """The Cancel button sends the kernel an interrupt: in the kernel, a SIGINT; here
    ``interrupt_main``, which raises KeyboardInterrupt on the main thread the same way."""
    from gpunb.analysis.checks import checklist
    from gpunb.readings.torch_build import TorchBuild

    monkeypatch.setattr(checklist, "read_torch_build",
                        lambda: TorchBuild(True, "2.11.0+cu130", "13.0", None, "/site-packages/torch"))
    def interrupt_when_started() -> None:
        slow_probe()
        time.sleep(0.3)
        _thread.interrupt_main()

    timer = threading.Thread(target=interrupt_when_started, daemon=True)
    timer.start()
    t0 = time.monotonic()
    result = ip.run_cell("%gpucheck")
    timer.join(10)
    assert isinstance(result.error_in_exec, KeyboardInterrupt), result.error_in_exec
    assert time.monotonic() - t0 < 15, "the cell waited for the probe (20 s a stage) instead of ending it"
    assert gone(slow_probe())
    assert not [t for t in threading.enumerate() if t.name == "gpunb-check-probe" and t.is_alive()
                and not (t.join(3) or not t.is_alive())]
