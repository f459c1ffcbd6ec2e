"""A real Jupyter server in the test process (pytest-jupyter's fixtures: ``jp_serverapp``,
``jp_fetch``...), with gpunb's extension enabled and a fake NVML whose process list the
tests fill with the PIDs of real kernels.

pytest-jupyter is imported here, not as a global plugin: its autouse fixtures (an event
loop per test, server cleanup) then apply to these tests only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  fixtures and async-test hooks

from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.process_facts import FAKE_DEVICES_ENV
from gpunb.testing import FakeGpu, FakePynvml, load_trace

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]
DEVICE_NAMES = ("nvidiactl", "nvidia0", "nvidia-uvm")


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"gpunb": True}}}


@pytest.fixture
def fake_devices(tmp_path, monkeypatch):
    """Files standing in for /dev/nvidia*: a process that opens them "holds the GPU" for
    gpunb's device-file check. Set before kernels start, so they inherit it."""
    d = tmp_path / "dev"
    d.mkdir()
    for name in DEVICE_NAMES:
        (d / name).write_bytes(b"")
    monkeypatch.setenv(FAKE_DEVICES_ENV, str(d))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return d


@pytest.fixture
def fake_gpu(fake_devices):
    """One recorded H200 at its idle moment (no recorded processes); tests list processes in
    ``fake.gpus[0].extra_processes`` (``drop_exited``: an exited one drops off, as with a driver)."""
    trace = load_trace()
    idle = [dict(s, processes=[]) for s in trace["samples"] if s["phase"] == "idle"][:1]
    gpu = FakeGpu(facts=dict(trace["facts"]), samples=idle)
    fake = FakePynvml([gpu], clock=lambda: 0.0)
    nvml_module.set_default_session(NvmlSession(fake))
    yield fake
    nvml_module.set_default_session(None)


def hold(fake: FakePynvml, pid: int, nbytes: int, gpu: int = 0) -> None:
    fake.gpus[gpu].extra_processes.append({"pid": pid, "used_gpu_memory": nbytes})


async def start_session(jp_fetch, path: str, kind: str = "notebook") -> dict:
    body = {"path": path, "name": os.path.basename(path), "type": kind, "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    return json.loads(r.body)


def _client(serverapp, kernel_id: str):
    """An async client of the server's kernel, made by its kernel manager: whether the kernel is
    alive is then asked of the manager (a bare client asks the heartbeat, which jupyter_client
    8.10 reads as dead before the kernel's first beat: "Kernel died before replying")."""
    kc = serverapp.kernel_manager.get_kernel(kernel_id).client()
    kc.start_channels()
    return kc


async def run_in_kernel(serverapp, kernel_id: str, code: str, timeout: float = 60) -> str:
    """Run ``code`` in a kernel of the server through an async client on the server's own
    event loop (so the server keeps answering meanwhile); its printed output."""
    kc = _client(serverapp, kernel_id)
    out: list[str] = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    try:
        await kc.wait_for_ready(timeout=timeout)
        reply = await kc.execute_interactive(code, timeout=timeout, output_hook=collect)
    finally:
        kc.stop_channels()
    if reply["content"]["status"] != "ok":
        raise AssertionError("kernel code failed:\n" + "".join(out))
    return "".join(out)


HOLD_DEVICES = (
    "import os\n"
    f"_gpunb_fake_devices = [open(os.path.join(os.environ[{FAKE_DEVICES_ENV!r}], n), 'rb') "
    f"for n in {DEVICE_NAMES!r}]\n"
)


async def kernel_holding_devices(serverapp, kernel_id: str) -> int:
    """Make the kernel open the fake device files; its PID."""
    return int(await run_in_kernel(serverapp, kernel_id, HOLD_DEVICES + "print(os.getpid())"))


async def child_holding_devices(serverapp, kernel_id: str) -> int:
    """Make the kernel start a child process that holds the fake devices; the child's PID."""
    child = HOLD_DEVICES.replace("\n", "; ") + "print('ready', flush=True); import time; time.sleep(600)"
    code = (
        "import subprocess, sys\n"
        f"_gpunb_child = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
        "assert _gpunb_child.stdout.readline().strip() == 'ready'\n"
        "print(_gpunb_child.pid)"
    )
    return int(await run_in_kernel(serverapp, kernel_id, code))


@pytest.fixture
def stray_processes():
    """Processes started by the test (killed afterwards)."""
    procs: list[subprocess.Popen] = []

    def start(*code_lines: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", "\n".join(code_lines)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)


async def start_cell(serverapp, kernel_id: str, code: str):
    """Start ``code`` in a kernel without waiting for it; the client (stop its channels)."""
    kc = _client(serverapp, kernel_id)
    await kc.wait_for_ready(timeout=60)
    kc.execute(code)
    return kc


async def wait_for_state(serverapp, kernel_id: str, state: str, timeout: float = 30) -> None:
    """Until the server itself records ``state`` for the kernel."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while serverapp.kernel_manager.kernel_model(kernel_id)["execution_state"] != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"kernel never became {state}")
        await asyncio.sleep(0.05)
