"""The server extension on a busy node (issue 21, "server at scale"): what keeps the report for
thousands of GPU processes fast, and the event loop free. The timings themselves are
``benchmarks/server_scale.py``; these tests pin the mechanisms."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

from gpunb.analysis.holders.gpus import HoldersReport, build_report
from gpunb.readings import process_facts
from gpunb.readings.nvml import NvmlSession
from gpunb.shells.server_service import GpuReportService
from gpunb.testing import FakeGpu, FakePynvml, load_trace


def _session(pids):
    trace = load_trace()
    gpu = FakeGpu(facts=dict(trace["facts"]), samples=[dict(trace["samples"][0], processes=[])])
    gpu.extra_processes = [{"pid": pid, "used_gpu_memory": 2**30} for pid in pids]
    return NvmlSession(FakePynvml([gpu]))


def test_the_report_never_asks_nvml_for_process_names(monkeypatch):
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        nvml = _session([c.pid for c in children])
        asked: list[str] = []
        real = nvml.query
        monkeypatch.setattr(nvml, "query", lambda name, *a, **k: (asked.append(name), real(name, *a, **k))[1])
        report = build_report(nvml, ())
        assert "nvmlSystemGetProcessName" not in asked
        names = {h.pid: h.process_name for h in report.holders()}
        assert set(names) == {c.pid for c in children}
        assert all("python" in n for n in names.values())  # named from /proc instead
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_parent_chains_are_read_once_per_report(monkeypatch):
    reads: list[int] = []
    real = process_facts.read_ppid
    monkeypatch.setattr(process_facts, "read_ppid", lambda pid, root="/proc": (reads.append(pid), real(pid, root))[1])
    cache = process_facts.AncestorCache()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(4)]
    try:
        facts = [process_facts.read_process_facts(c.pid, ancestors=cache) for c in children]
        assert all(f.ancestors[0] == os.getpid() for f in facts)
        assert len(reads) == len(set(reads))  # this process and its ancestors: read once, not once per child
        slow = process_facts.read_process_facts(children[0].pid)  # psutil's path gives the same facts
        assert slow == facts[0]
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_an_answer_body_is_made_once_per_report_and_off_the_event_loop():
    made: list[str] = []

    def render(report: HoldersReport) -> bytes:
        made.append(threading.current_thread().name)
        return b"body"

    class Kernels:
        def list_kernel_ids(self):
            return []

    async def scenario():
        service = GpuReportService(Kernels(), nvml=_session([]), max_age_s=60)
        try:
            bodies = await asyncio.gather(*(service.rendered("json", render) for _ in range(5)))
            again = await service.rendered("json", render)
        finally:
            service.close()
        return bodies, again

    bodies, again = asyncio.run(scenario())
    assert bodies == [b"body"] * 5 and again == b"body"
    assert len(made) == 1 and made[0].startswith("gpunb-render")
