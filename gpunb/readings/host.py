"""Host readings (CPU, RAM, shared memory, disk) from psutil and the file system."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class HostFacts:
    cpu_logical: int | None
    cpu_physical: int | None
    cpu_affinity: int | None  # CPUs this process may run on (containers/taskset limit it)
    ram_total_bytes: int
    ram_available_bytes: int
    shm_total_bytes: int | None  # /dev/shm: DataLoader workers pass batches through it
    shm_free_bytes: int | None
    disk_path: str
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    cwd_deleted: bool = False  # the current directory no longer exists (removed while we ran)


@dataclass(frozen=True)
class HostSample:
    t_s: float
    cpu_pct: float  # whole machine, 0-100
    ram_used_bytes: int
    ram_total_bytes: int
    process_rss_bytes: int  # this kernel


def _disk(path: str) -> tuple[int | None, int | None]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.free, usage.total


def read_host_facts(disk_path: str | None = None) -> HostFacts:
    vm = psutil.virtual_memory()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    shm_free, shm_total = _disk("/dev/shm") if os.path.isdir("/dev/shm") else (None, None)
    cwd_deleted = False
    try:
        path = disk_path or os.getcwd()
    except FileNotFoundError:  # the directory was removed under us: no cwd to measure
        path, cwd_deleted = "", True
    disk_free, disk_total = _disk(path) if path else (None, None)
    return HostFacts(
        cpu_logical=psutil.cpu_count(logical=True),
        cpu_physical=psutil.cpu_count(logical=False),
        cpu_affinity=affinity,
        ram_total_bytes=vm.total,
        ram_available_bytes=vm.available,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        disk_path=path,
        disk_free_bytes=disk_free,
        disk_total_bytes=disk_total,
        cwd_deleted=cwd_deleted,
    )


_process = psutil.Process()


def ram_available_bytes() -> int:
    """Host memory a program can still take without swapping (psutil's ``available``)."""
    return int(psutil.virtual_memory().available)


def read_host_sample(clock: Callable[[], float] = time.monotonic) -> HostSample:
    """CPU % since the previous call (psutil's non-blocking mode), RAM, this process's RSS."""
    vm = psutil.virtual_memory()
    return HostSample(
        t_s=clock(),
        cpu_pct=psutil.cpu_percent(interval=None),
        ram_used_bytes=vm.total - vm.available,
        ram_total_bytes=vm.total,
        process_rss_bytes=_process.memory_info().rss,
    )
