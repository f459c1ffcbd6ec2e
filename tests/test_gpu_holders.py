"""Who holds each GPU: the join of NVML's PIDs, the process table and a server's kernels,
its words, its metrics, and how a notebook shows it (no Jupyter server here: the server
itself is tested in ``tests/server``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunb.analysis.holders import gpus as gh
from gpunb.analysis.holders.server import holder_lines, names_by_pid, pid_lines
from gpunb.analysis.machine import NO_GPU
from gpunb.readings.gpu import GpuProcess
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.process_facts import FAKE_DEVICES_ENV, ProcessFacts, kernel_id_of, read_process_facts
from gpunb.readings.server_kernels import KernelInfo, SessionInfo
from gpunb.readings.server_sessions import ServerReading
from gpunb.testing import scenario
from gpunb.views.holders_view import holders_html, holders_text
from gpunb.views.metrics_view import metrics_text

GiB = 2**30
NOW = 1_800_000_000.0
DEV = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm")
LESSON = KernelInfo("k-lesson", "python3", 100, "idle", NOW - 40 * 60, 0,
                    (SessionInfo("course/lesson3.ipynb", "lesson3.ipynb", "notebook"),))
TRAIN = KernelInfo("k-train", "python3", 200, "busy", NOW - 5, 1,
                   (SessionInfo("train.ipynb", "train.ipynb", "notebook"),))


def facts_table(**extra: ProcessFacts):
    table = {
        100: ProcessFacts(100, True, "python3", "ann", 1000, 10, (10, 1), nvidia_files=DEV),
        201: ProcessFacts(201, True, "pt_data_worker", "ann", 1000, 200, (200, 10, 1), nvidia_files=DEV),
        300: ProcessFacts(300, True, "python3", "bob", 1001, 1, (1,), script="train.py", nvidia_files=None),
        400: ProcessFacts(400, True, "python3", "ann", 1000, 1, (1,), kernel_id="k-old", is_jupyter_kernel=True,
                          nvidia_files=DEV),
        500: ProcessFacts(500, True, "sshd", "root", 0, 1, (1,), nvidia_files=()),
    }
    table.update({int(k[1:]): v for k, v in extra.items()})
    return lambda pid: table.get(pid, ProcessFacts(pid, exists=False))


@pytest.mark.parametrize("pid, kind", [(100, gh.KERNEL), (201, gh.KERNEL_CHILD), (300, gh.PROCESS),
                                       (400, gh.OTHER_KERNEL), (500, gh.PID_MISMATCH), (999, gh.NOT_VISIBLE)])
def test_each_gpu_process_is_classified_from_what_can_be_known(pid, kind):
    h = gh.classify(pid, 0, GiB, (LESSON, TRAIN), facts_table())
    assert h.kind == kind
    if kind in (gh.KERNEL, gh.KERNEL_CHILD):
        owner = LESSON if pid == 100 else TRAIN
        assert (h.kernel_id, h.path, h.execution_state) == (owner.kernel_id, owner.path, owner.execution_state)
    if kind == gh.PROCESS:  # another user's process: fds unreadable, so it is taken as NVML says
        assert (h.username, h.script) == ("bob", "train.py")


def test_a_kernel_without_its_server_is_called_left_behind_and_one_with_a_server_is_named():
    def kernel(pid, ppid):
        return ProcessFacts(pid, True, "python3", "ann", 1000, ppid, (ppid, 1), kernel_id=f"k{pid}",
                            is_jupyter_kernel=True, nvidia_files=DEV)

    facts = facts_table(p41=kernel(41, 77), p42=kernel(42, 78), p43=kernel(43, 79),
                        p77=ProcessFacts(77, True, "jupyter-lab", "ann", 1000, 1, (1,)),
                        p78=ProcessFacts(78, True, "code", "ann", 1000, 1, (1,)))
    assert "left behind" in gh.classify(400, 0, GiB, (), facts).note  # parent is init
    assert gh.classify(41, 0, GiB, (), facts).note == "of another Jupyter server (parent PID 77 jupyter-lab)"
    assert gh.classify(42, 0, GiB, (), facts).note == "started by PID 78 code"
    assert "left behind" in gh.classify(43, 0, GiB, (), facts).note  # parent 79 is gone


def test_words_name_the_notebook_its_state_and_idle_time():
    facts = facts_table()
    lesson = gh.classify(100, 0, 31 * GiB, (LESSON, TRAIN), facts)
    assert gh.holder_line(lesson, NOW) == "course/lesson3.ipynb (idle 40 min) holds 31.0 GiB"
    assert gh.describe(lesson, NOW, this_kernel_id="k-lesson") == "this notebook"
    worker = gh.classify(201, 0, GiB, (LESSON, TRAIN), facts)
    assert gh.describe(worker, NOW) == "train.ipynb (busy), its child PID 201 pt_data_worker"
    assert gh.describe(gh.classify(300, 0, GiB, (), facts), NOW) == "PID 300 python3 train.py (user bob)"
    assert "a process outside this container" in gh.describe(gh.classify(999, 0, GiB, (), facts), NOW)
    assert [gh.duration_words(s) for s in (5, 89, 90, 40 * 60, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)] == [
        "5 s", "89 s", "2 min", "40 min", "3 h 5 min", "2 d 4 h"]


def test_report_joins_fake_nvml_with_kernels_and_says_why_it_cannot_map():
    fake = scenario("h200", clock=lambda: 0.3)  # the recorded idle moment: no processes
    fake.gpus[0].extra_processes = [{"pid": 100, "used_gpu_memory": 31 * GiB},
                                    {"pid": 201, "used_gpu_memory": 2 * GiB},
                                    {"pid": 999, "used_gpu_memory": 4 * GiB}]
    r = gh.build_report(NvmlSession(fake), (LESSON, TRAIN), facts_of=facts_table(), children_of=lambda pid: (),
                        now=lambda: NOW)
    d = r.devices[0]
    assert d.memory_used_bytes == 37 * GiB and d.power_w == pytest.approx(81.164)
    assert [h.kind for h in d.holders] == [gh.KERNEL, gh.KERNEL_CHILD, gh.NOT_VISIBLE]
    uses = {u.kernel.kernel_id: u for u in r.kernels}
    assert uses["k-lesson"].gpu_bytes == {0: 31 * GiB} and uses["k-train"].gpu_bytes == {0: 2 * GiB}
    assert uses["k-lesson"].has_cuda_context is True
    assert r.notes == (gh.NAMESPACE_NOTE,)
    data = r.to_dict()
    assert data["kernels"][0]["idle_s"] == 40 * 60 and data["kernels"][1]["idle_s"] is None
    assert data["gpus"][0]["clock_event_names"] == ["idle"]


def test_missing_readings_are_null_with_a_reason_and_absent_from_the_metrics():
    r = gh.build_report(NvmlSession(scenario("power-not-supported")), (), facts_of=facts_table(), now=lambda: NOW)
    assert r.devices[0].power_w is None and "not supported" in r.devices[0].unavailable["power_w"]
    body, _content_type = metrics_text(r)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["gpunb_gpu_power_watts"].samples == []
    assert families["gpunb_gpu_temperature_celsius"].samples[0].value == 35.0
    none = gh.build_report(NvmlSession(scenario("no-driver")), (LESSON,), facts_of=facts_table(), now=lambda: NOW)
    assert not none.nvml_ok and none.devices == () and "libnvidia-ml" in none.nvml_cause
    assert none.notes[0] == NO_GPU.sentence  # the machine's one statement, no driver advice on a laptop
    body, _ = metrics_text(none)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["gpunb_nvml_up"].samples[0].value == 0.0
    assert families["gpunb_kernel_busy"].samples[0].labels["path"] == "course/lesson3.ipynb"


def _reading(kernel_id: str = "") -> ServerReading:
    r = gh.build_report(NvmlSession(scenario("h200", clock=lambda: 0.3)), (LESSON, TRAIN), facts_of=facts_table(),
                        now=lambda: NOW)
    data = r.to_dict()
    rows = [gh.GpuHolder(0, 100, 31 * GiB, gh.KERNEL, "k-lesson", 100, "course/lesson3.ipynb", "notebook", "idle",
                         NOW - 40 * 60).to_dict(),
            gh.GpuHolder(0, 200, 2 * GiB, gh.KERNEL, "k-train", 200, "train.ipynb", "notebook", "busy").to_dict(),
            gh.GpuHolder(0, 300, 40 * GiB, gh.PROCESS, process_name="python3", username="bob").to_dict()]
    data["gpus"][0]["processes"] = rows
    return ServerReading(data, kernel_id=kernel_id, url="http://127.0.0.1:8888/")


def test_a_notebook_reads_the_servers_answer_as_lines_and_names():
    fake, *lines = holder_lines(_reading(kernel_id="k-train"), 0)
    assert fake.startswith("fake: these figures come from gpunb's test stand-ins (fake NVML)")  # the recording
    assert lines == ["PID 300 python3 (user bob) holds 40.0 GiB",
                     "course/lesson3.ipynb (idle 40 min) holds 31.0 GiB",
                     "this notebook holds 2.0 GiB"]
    assert holder_lines(_reading(), 1) == []  # no such GPU in the answer
    assert names_by_pid(_reading())[100] == "course/lesson3.ipynb (idle 40 min)"
    assert holder_lines(ServerReading(None, reason="no server"), 0) == []


def test_without_a_server_the_lines_name_pids_and_this_kernel():
    procs = [GpuProcess(os.getpid(), 3 * GiB, "python"), GpuProcess(412, 9 * GiB, "python3"), GpuProcess(7, None)]
    assert pid_lines(procs, {os.getpid()}) == ["PID 412 python3 holds 9.0 GiB", "this kernel holds 3.0 GiB",
                                               "PID 7 holds an unknown amount"]
    many = [GpuProcess(1000 + i, (i + 1) * GiB) for i in range(9)]
    lines = pid_lines(many, ())
    assert len(lines) == 7 and lines[-1] == "3 more process(es) hold 6.0 GiB"


def test_process_names_and_paths_are_escaped_in_html():
    hostile = '<img src=x onerror="alert(1)">.ipynb (idle 2 min) holds 1.0 GiB'
    page = holders_html([hostile])
    assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert holders_html([]) == "" and holders_text([]) == []
    assert holders_text(["a", "b"]) == ["  GPU memory held by: a; b"]


def test_process_facts_of_real_processes(tmp_path, monkeypatch):
    me = read_process_facts(os.getpid())
    assert me.exists and me.ppid == os.getppid() and me.ancestors[0] == os.getppid()
    assert me.nvidia_files == () and me.has_cuda_context is False
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(FAKE_DEVICES_ENV, str(tmp_path))
    code = ("import os, sys, time; fs = [open(os.path.join(sys.argv[1], n)) for n in ('nvidiactl', 'nvidia-uvm')]; "
            "print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "-f", "/run/kernel-1b2c-3d.json"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        f = read_process_facts(child.pid)
        assert f.ancestors[0] == os.getpid() and f.script == "-c"
        assert f.kernel_id == "1b2c-3d" and f.is_jupyter_kernel
        assert {os.path.basename(p) for p in f.nvidia_files} == {"nvidiactl", "nvidia-uvm"}
        assert f.has_cuda_context is True
    finally:
        child.kill()
        child.wait()
    gone = read_process_facts(child.pid)
    assert not gone.exists
    assert kernel_id_of(["python", "-m", "ipykernel_launcher", "-f", "/x/kernel-abc.json"]) == "abc"


def test_kernel_records_are_read_from_a_servers_managers():
    import asyncio
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from gpunb.readings.server_kernels import read_server_kernels

    stamp = datetime(2027, 1, 15, 10, 0, tzinfo=timezone.utc)

    class Kernels:
        def list_kernel_ids(self):
            return ["a", "b", "gone"]

        def get_kernel(self, kid):
            if kid == "gone":
                raise KeyError(kid)
            provisioner = SimpleNamespace(pid=4242, process=None) if kid == "a" else SimpleNamespace(pid=None)
            return SimpleNamespace(provisioner=provisioner)

        def kernel_model(self, kid):
            return {"id": kid, "name": "python3", "execution_state": "idle", "connections": 1,
                    "last_activity": stamp.isoformat().replace("+00:00", "Z")}

    class Sessions:
        async def list_sessions(self):
            return [{"path": "x/lesson3.ipynb", "name": "lesson3.ipynb", "type": "notebook", "kernel": {"id": "a"}}]

    kernels = asyncio.run(read_server_kernels(Kernels(), Sessions()))
    assert [(k.kernel_id, k.pid, k.path) for k in kernels] == [("a", 4242, "x/lesson3.ipynb"), ("b", None, "")]
    assert kernels[0].last_activity_unix == stamp.timestamp() and kernels[0].connections == 1


@pytest.mark.parametrize("fake_nvml", ["busy"], indirect=True)
def test_the_monitor_names_holders_by_notebook_with_a_server_and_by_pid_without(fake_nvml):
    from gpunb.readings import server_sessions as ss
    from gpunb.shells.monitor import monitor

    ss.set_default_sessions(ss.ServerSessions(find=lambda: ss.NoServer("terminal IPython")))
    m = monitor(frontend="text")
    try:
        assert "GPU memory held by: PID 999001 python3 holds 40.0 GiB" in m.text()
        assert "PID 999001 python3 holds 40.0 GiB" in m.html()
        reading = _reading()
        reading.data["t_unix"] = time.time()
        reading.data["gpus"][0]["processes"][0]["last_activity_unix"] = time.time() - 40 * 60
        link = ss.ServerLink("http://127.0.0.1:1/", "t", None, "k-train", "parent process")
        ss.set_default_sessions(ss.ServerSessions(find=lambda: link, fetch=lambda *args: reading.data))
        ss.default_sessions().get()  # what the background refresh would have fetched by now
        text = m.text()
        assert "course/lesson3.ipynb (idle 40 min) holds 31.0 GiB" in text and "this notebook holds 2.0 GiB" in text
        assert "course/lesson3.ipynb (idle 40 min) holds 31.0 GiB" in m.html()
    finally:
        m.stop()
        ss.set_default_sessions(None)
