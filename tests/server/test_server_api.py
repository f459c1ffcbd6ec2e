"""The server extension against a real Jupyter server and real kernels.

The kernels, their child processes and their PIDs are real; the GPU is the fake NVML
(recorded H200 readings) told that those PIDs hold memory, and the processes hold files
standing in for the NVIDIA device files (see ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpunb.analysis.holders.gpus import NAMESPACE_NOTE

from .conftest import GiB, child_holding_devices, hold, kernel_holding_devices, run_in_kernel, start_session

UUID = "GPU-6fa48cea-f20c-eafe-9125-0427b9f214a8"
HOSTILE_PATH = 'work/</script><img src=x onerror="alert(1)">\n"q" \\ .ipynb'


async def test_gpus_and_metrics_map_real_kernels_to_their_notebooks(jp_fetch, jp_serverapp, fake_gpu,
                                                                    stray_processes):
    lesson = await start_session(jp_fetch, "course/lesson3.ipynb")
    console = await start_session(jp_fetch, "scratch", kind="console")
    hostile = await start_session(jp_fetch, HOSTILE_PATH)
    idle_kernel = await start_session(jp_fetch, "empty.ipynb")  # holds nothing
    app = jp_serverapp
    lesson_pid = await kernel_holding_devices(app, lesson["kernel"]["id"])
    child_pid = await child_holding_devices(app, console["kernel"]["id"])
    hostile_pid = await kernel_holding_devices(app, hostile["kernel"]["id"])
    # A script that holds the GPU but is no kernel; a PID with no NVIDIA device open (what a
    # host PID looks like from inside a container); a PID that does not exist here.
    script = stray_processes(
        "import os", "fs = [open(os.path.join(os.environ['GPUNB_FAKE_NVIDIA_DEVICES'], n)) for n in "
        "('nvidiactl', 'nvidia0')]", "print('ready', flush=True)", "import time; time.sleep(600)")
    assert script.stdout.readline().strip() == "ready"
    unrelated = stray_processes("import time; print('ready', flush=True); time.sleep(600)")
    assert unrelated.stdout.readline().strip() == "ready"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    missing_pid = next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))
    for pid, gib_held in ((lesson_pid, 31), (child_pid, 3), (hostile_pid, 2), (script.pid, 5),
                          (unrelated.pid, 7), (missing_pid, 11)):
        hold(fake_gpu, pid, gib_held * GiB)

    r = await jp_fetch("gpunb", "api", "gpus")
    assert r.headers["Content-Type"].startswith("application/json")
    assert b"</" not in r.body  # JSON is data, but it must never close a <script> it lands in
    report = json.loads(r.body)
    gpu = report["gpus"][0]
    assert gpu["uuid"] == UUID and gpu["memory_used_bytes"] == 59 * GiB
    by_pid = {p["pid"]: p for p in gpu["processes"]}
    assert by_pid[lesson_pid]["kind"] == "kernel"
    assert by_pid[lesson_pid]["path"] == "course/lesson3.ipynb"
    assert by_pid[lesson_pid]["kernel_id"] == lesson["kernel"]["id"]
    assert by_pid[lesson_pid]["execution_state"] == "idle"
    assert abs(by_pid[lesson_pid]["last_activity_unix"] - time.time()) < 120
    assert by_pid[child_pid]["kind"] == "kernel-child"
    assert by_pid[child_pid]["kernel_id"] == console["kernel"]["id"]
    assert by_pid[child_pid]["path"] == "scratch" and by_pid[child_pid]["session_type"] == "console"
    assert by_pid[hostile_pid]["path"] == HOSTILE_PATH  # escaped in transit, the same value out
    assert by_pid[script.pid]["kind"] == "process" and by_pid[script.pid]["process_name"].startswith("python")
    assert by_pid[script.pid]["script"] == "-c"
    assert by_pid[unrelated.pid]["kind"] == "pid-namespace"
    assert by_pid[missing_pid]["kind"] == "not-visible"
    assert NAMESPACE_NOTE in report["notes"]
    kernels = {k["kernel_id"]: k for k in report["kernels"]}
    assert kernels[lesson["kernel"]["id"]]["gpu_memory_bytes"] == {"0": 31 * GiB}
    assert kernels[lesson["kernel"]["id"]]["has_cuda_context"] is True
    assert kernels[lesson["kernel"]["id"]]["idle_s"] is not None
    assert kernels[console["kernel"]["id"]]["gpu_pids"] == [child_pid]
    assert kernels[console["kernel"]["id"]]["has_cuda_context"] is True  # through its child
    assert kernels[idle_kernel["kernel"]["id"]]["gpu_memory_total_bytes"] == 0
    assert kernels[idle_kernel["kernel"]["id"]]["has_cuda_context"] is False

    r = await jp_fetch("gpunb", "metrics")
    assert r.headers["Content-Type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(r.body.decode())}
    held = {s.labels["path"]: s for s in families["gpunb_kernel_gpu_memory_bytes"].samples}
    assert held["course/lesson3.ipynb"].value == 31 * GiB
    assert held["course/lesson3.ipynb"].labels["UUID"] == UUID and held["course/lesson3.ipynb"].labels["gpu"] == "0"
    assert held["course/lesson3.ipynb"].labels["kernel_id"] == lesson["kernel"]["id"]
    assert held["scratch"].value == 3 * GiB
    # quotes and backslash survive the label escaping; the newline (a control character) becomes U+FFFD
    assert held[HOSTILE_PATH.replace("\n", "\ufffd")].value == 2 * GiB
    other = {s.labels["kind"]: s.value for s in families["gpunb_gpu_other_memory_bytes"].samples}
    assert other == {"process": 5 * GiB, "pid-namespace": 7 * GiB, "not-visible": 11 * GiB}
    used = families["gpunb_gpu_memory_used_bytes"].samples[0]
    assert used.value == 59 * GiB and used.labels == {"gpu": "0", "UUID": UUID, "modelName": "NVIDIA H200"}
    assert families["gpunb_nvml_up"].samples[0].value == 1.0
    busy = {s.labels["path"]: s.value for s in families["gpunb_kernel_busy"].samples}
    assert busy["course/lesson3.ipynb"] == 0.0
    reasons = {s.labels["reason"]: s.value for s in families["gpunb_gpu_clock_event_active"].samples}
    assert reasons["idle"] == 1.0 and reasons["power cap"] == 0.0  # the recorded idle sample: mask 0x1


async def test_a_kernel_finds_its_server_and_names_its_notebook(jp_fetch, jp_serverapp, fake_gpu):
    lesson = await start_session(jp_fetch, "lesson3.ipynb")
    me = await start_session(jp_fetch, "mine.ipynb")
    lesson_pid = await kernel_holding_devices(jp_serverapp, lesson["kernel"]["id"])
    my_pid = await kernel_holding_devices(jp_serverapp, me["kernel"]["id"])
    hold(fake_gpu, lesson_pid, 31 * GiB)
    hold(fake_gpu, my_pid, 2 * GiB)
    code = (
        "from gpunb.readings.server_sessions import find_server, default_sessions\n"
        "from gpunb.analysis.holders.server import holder_lines\n"
        "link = find_server()\n"
        "print(link.found_by, link.kernel_id)\n"
        "reading = default_sessions().get()\n"
        "print(reading.reason)\n"
        "for line in holder_lines(reading, 0): print(line)\n"
    )
    out = await run_in_kernel(jp_serverapp, me["kernel"]["id"], code)
    lines = out.splitlines()
    assert lines[0] == f"parent process {me['kernel']['id']}"
    assert lines[1] == ""
    assert any(line.startswith("lesson3.ipynb (idle ") and line.endswith("holds 31.0 GiB") for line in lines[2:]), out
    assert "this notebook holds 2.0 GiB" in lines[2:], out
