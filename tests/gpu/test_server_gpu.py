"""The server extension on a real GPU: a Jupyter server (a subprocess, with gpunb's shipped
config), two real kernels each holding CUDA memory, the real NVML.

``/gpunb/api/gpus`` must map both GPU processes to their notebooks; ``/gpunb/metrics`` must
carry each notebook's memory; a kernel must find its server and name the other notebook;
shutting down one idle kernel through ``/gpunb/api/kernels/<id>/shutdown`` must give its
memory back (read again from NVML). Results in ``$GPUNB_RESULTS/server_gpu.json``.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_server_gpu.py -v
It needs jupyter_server and prometheus_client there (see CONTRIBUTING.md, "On the GPU test machine").
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (this test runs on the GPU test machine)", allow_module_level=True)
pytest.importorskip("jupyter_server", reason="the GPU machine needs the jupyter_server wheels (CONTRIBUTING.md)")
pytest.importorskip("jupyter_client")
parser = pytest.importorskip("prometheus_client.parser")

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
HELD = {"lesson-a.ipynb": 6, "course/lesson-b.ipynb": 10}  # GiB each kernel allocates


def _results() -> Path:
    path = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base: str, token: str, runtime: Path) -> None:
        self.base, self.token, self.runtime = base, token, runtime

    def call(self, path: str, body: dict | None = None, raw: bool = False):
        request = urllib.request.Request(
            f"{self.base}/{path}", method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=60) as r:
            data = r.read()
        return data.decode() if raw else json.loads(data)

    def run(self, kernel_id: str, code: str) -> str:
        from jupyter_client import BlockingKernelClient

        # The server says when the kernel is up: a client made outside a KernelManager judges
        # "alive" by heartbeats alone, and one missed on a busy host reads as "Kernel died
        # before replying to kernel_info" (run 3, beside the multi-GPU tests) while it lived.
        deadline = time.monotonic() + 120
        while self.call(f"api/kernels/{kernel_id}")["execution_state"] == "starting":
            assert time.monotonic() < deadline, f"kernel {kernel_id} still starting after 120 s"
            time.sleep(0.5)
        kc = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels()
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        try:
            for attempt in range(3):
                try:
                    kc.wait_for_ready(timeout=120)
                    break
                except RuntimeError:  # a missed heartbeat; the server knows whether it really died
                    state = self.call(f"api/kernels/{kernel_id}")["execution_state"]
                    if state == "dead" or attempt == 2:
                        raise
            reply = kc.execute_interactive(code, timeout=300, output_hook=hook)
        finally:
            kc.stop_channels()
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)


@pytest.fixture
def server(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    config, runtime, root = tmp_path / "config", tmp_path / "runtime", tmp_path / "root"
    (config / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(ROOT / "jupyter-config/jupyter_server_config.d/gpunb.json", config / "jupyter_server_config.d")
    (root / "course").mkdir(parents=True)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(runtime),
               IPYTHONDIR=str(tmp_path / "ipython"),
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])))
    env.pop("GPUNB_FAKE_NVML", None)
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (the server writes to it until teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    s = Server(f"http://127.0.0.1:{port}", token, runtime)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                s.call("gpunb/api/gpus")
                break
            except (OSError, urllib.error.HTTPError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("jupyter server with gpunb did not start:\n"
                                + (tmp_path / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        yield s
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.copy(tmp_path / "server.log", _results() / "server_gpu.log")


HOLD = """
import os, torch
_held = torch.empty({n} * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(os.getpid(), str(torch.cuda.get_device_properties(0).uuid))
"""

SAY = """
from gpunb.analysis.holders.server import ask_server, holder_lines
reading = ask_server(wait=True)
print(reading.reason or "ok")
for gpu in reading.data["gpus"] if reading else ():
    for line in holder_lines(reading, gpu["index"]):
        print(line)
"""


def _same_uuid(a: str, b: str) -> bool:
    return a.lower().removeprefix("gpu-") == b.lower().removeprefix("gpu-")


def test_two_real_kernels_are_mapped_to_their_notebooks_and_one_is_shut_down(server):
    kernels, pids, uuid = {}, {}, ""
    for path, gib_held in HELD.items():
        session = server.call("api/sessions", {"path": path, "name": os.path.basename(path), "type": "notebook",
                                               "kernel": {"name": "python3"}})
        kernels[path] = session["kernel"]["id"]
        pid, uuid = server.run(kernels[path], HOLD.format(n=gib_held)).split()
        pids[path] = int(pid)

    deadline = time.monotonic() + 30
    while True:  # NVML lists a process once its context exists; give the driver a moment
        report = server.call("gpunb/api/gpus")
        gpu = next(g for g in report["gpus"] if _same_uuid(g["uuid"], uuid))
        by_pid = {p["pid"]: p for p in gpu["processes"]}
        if all(pid in by_pid for pid in pids.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    results = {"report": report, "pids": pids, "kernels": kernels}
    (_results() / "server_gpu.json").write_text(json.dumps(results, indent=1))
    assert all(pid in by_pid for pid in pids.values()), (
        f"NVML's processes {sorted(by_pid)} do not include the kernels' PIDs {pids}; notes: {report['notes']}")
    for path, pid in pids.items():
        row = by_pid[pid]
        assert (row["kind"], row["path"], row["kernel_id"]) == ("kernel", path, kernels[path]), row
        assert row["execution_state"] == "idle" and row["last_activity_unix"] is not None
        # NVML's per-process memory: the tensor plus the CUDA context (a few hundred MiB)
        assert HELD[path] * GiB <= row["used_bytes"] <= (HELD[path] + 3) * GiB, row
    uses = {k["path"]: k for k in report["kernels"]}
    assert all(uses[path]["has_cuda_context"] is True for path in HELD)
    assert not report["notes"], report["notes"]

    families = {f.name: f for f in parser.text_string_to_metric_families(server.call("gpunb/metrics", raw=True))}
    held = {s.labels["path"]: s for s in families["gpunb_kernel_gpu_memory_bytes"].samples}
    for path, pid in pids.items():
        assert held[path].value == by_pid[pid]["used_bytes"] and _same_uuid(held[path].labels["UUID"], uuid)
    assert families["gpunb_gpu_power_watts"].samples and families["gpunb_gpu_temperature_celsius"].samples

    said = server.run(kernels["lesson-a.ipynb"], SAY).splitlines()
    results["kernel_a_says"] = said
    assert said[0] == "ok", said
    assert any(line.startswith("course/lesson-b.ipynb (idle ") for line in said), said
    assert any(line.startswith("this notebook holds 6.") for line in said), said

    b = kernels["course/lesson-b.ipynb"]
    done = server.call(f"gpunb/api/kernels/{b}/shutdown", {"confirm": b})
    results["shutdown"] = done
    index = str(gpu["index"])
    # the drop in used memory, net of other processes starting or ending meanwhile (their own
    # NVML entries before and after): what came back from this kernel
    freed = done["freed_bytes"][index]
    drift = done["other_processes_after_bytes"][index] - done["other_processes_before_bytes"][index]
    assert freed == done["memory_used_before_bytes"][index] - done["memory_used_after_bytes"][index] + drift
    results["freed_bytes"] = freed
    (_results() / "server_gpu.json").write_text(json.dumps(results, indent=1))
    assert done["held_bytes"][index] == by_pid[pids["course/lesson-b.ipynb"]]["used_bytes"]
    assert freed >= 0.95 * done["held_bytes"][index], done
    after = server.call("gpunb/api/gpus")
    assert pids["course/lesson-b.ipynb"] not in {p["pid"] for g in after["gpus"] for p in g["processes"]}
