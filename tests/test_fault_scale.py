"""60,000 GPU processes listed (a shared node): gpunb's own handling stays well under a second.
Before: each listed process's parents were walked and its name asked for (one driver call
each): ``gpunb.memory()`` 5.4 s, an unbounded ownership read took minutes here.
``benchmarks/many_processes.py`` times the whole entry points."""

from __future__ import annotations

import time
from types import SimpleNamespace

from gpunb.readings import gpu as gpu_readings
from gpunb.readings.devices import OWN_PID, ProcessTable, attribute_processes
from gpunb.readings.gpu import GpuProcess

N = 60_000


class CountingTable(ProcessTable):
    """The real process table, counting the per-process lookups."""

    def __init__(self) -> None:
        self.lookups = 0

    def ancestors(self, pid):
        self.lookups += 1
        return super().ancestors(pid)

    def holds_gpu(self, pid):
        self.lookups += 1
        return super().holds_gpu(pid)


def test_attributing_60000_processes_walks_the_process_table_once():
    import os

    procs = [GpuProcess(os.getpid(), 2**30, "")] + [GpuProcess(4_000_000 + i, 2**20, "") for i in range(N)]
    table = CountingTable()
    t0 = time.perf_counter()
    own = attribute_processes(0, procs, {os.getpid()}, 2**30, table)
    took = time.perf_counter() - t0
    assert own.how == OWN_PID and len(own.others) == N and own.others_bytes == N * 2**20
    assert table.lookups == 0  # this kernel is listed: nobody else's parents or files are read
    assert took < 1.0, took


def test_only_the_largest_processes_are_named():
    procs = [SimpleNamespace(pid=i, usedGpuMemory=i * 2**20) for i in range(N)]
    asked: list[int] = []

    class Nvml:
        def device_query(self, index, name):
            return procs

        def query(self, name, pid):
            asked.append(pid)
            return f"p{pid}"

    out = gpu_readings.read_processes(Nvml(), 0)
    assert len(out) == N and len(asked) == gpu_readings.MAX_NAMED_PROCESSES
    assert sorted(asked) == list(range(N - gpu_readings.MAX_NAMED_PROCESSES, N))  # the largest
    assert out[-1].name == f"p{N - 1}" and out[0].name == ""
