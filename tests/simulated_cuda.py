"""A stand-in for the user's torch after it initialized CUDA, for CPU tests of the CUDA paths.

``torch.cuda`` answers for the given devices (UUIDs as torch prints them, allocator counters
from the recorded H200 trace); CUDA events are stamped with the host clock; everything else
is the real (CPU) torch. The GPU tests under tests/gpu/ check the same paths on the H200.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch


class HostClockEvent:
    made = 0  # events created so far (a test resets it): the profiler must pool them

    def __init__(self, enable_timing: bool = False) -> None:
        HostClockEvent.made += 1
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None

    def synchronize(self) -> None:
        assert self.t is not None  # waiting for an event never recorded hangs on a GPU

    def elapsed_time(self, other: HostClockEvent) -> float:
        return (other.t - self.t) * 1000.0


def nested(stats: dict) -> dict:
    """``torch._C._cuda_memoryStats``'s layout of a flat ``memory_stats()`` dict."""
    out: dict = {}
    for key, value in stats.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


class SimulatedCuda:
    """``torch.cuda`` of a process that already has CUDA up on ``uuids`` (cuda:0, cuda:1, ...)."""

    Event = HostClockEvent

    def __init__(self, uuids: Sequence[str], stats: dict, total_bytes: int, name: str = "NVIDIA H200") -> None:
        self.uuids = [u.removeprefix("GPU-").removeprefix("MIG-") for u in uuids]  # torch prints them bare
        self.stats = dict(stats)
        self.total_bytes = total_bytes
        self.name = name
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.uuids)

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, device: int) -> SimpleNamespace:
        return SimpleNamespace(name=self.name, total_memory=self.total_bytes, major=9, minor=0,
                               uuid=self.uuids[device], multi_processor_count=132)

    def get_device_name(self, device: int = 0) -> str:
        return self.name

    def memory_stats(self, device: int = 0) -> dict:
        return self.stats

    def memory_allocated(self, device: int = 0) -> int:
        return self.stats["allocated_bytes.all.current"]

    def memory_reserved(self, device: int = 0) -> int:
        return self.stats["reserved_bytes.all.current"]

    def max_memory_allocated(self, device: int = 0) -> int:
        return self.stats["allocated_bytes.all.peak"]

    def mem_get_info(self, device: int = 0) -> tuple[int, int]:
        return self.total_bytes - self.stats["reserved_bytes.all.current"], self.total_bytes

    def reset_peak_memory_stats(self, device: int = 0) -> None:
        self.calls.append("reset_peak_memory_stats")

    def synchronize(self, device: Any = None) -> None:
        pass

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def get_per_process_memory_fraction(self, device: int = 0) -> float:
        return 1.0


class SimulatedTorch:
    """The real torch with ``cuda`` replaced (and ``version.cuda`` of a CUDA build)."""

    def __init__(self, cuda: SimulatedCuda) -> None:
        self.cuda = cuda
        self.version = SimpleNamespace(cuda="13.0", hip=None)
        self._C = SimpleNamespace(_cuda_memoryStats=lambda device: nested(cuda.stats))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def recorded_h200_cuda() -> SimulatedCuda:
    """cuda:0 is the recorded H200 (gpunb/testing/h200_trace.json), its counters those after training."""
    from gpunb.testing import load_trace

    trace = load_trace()
    facts = trace["facts"]
    return SimulatedCuda([facts["uuid"]], trace["memory_stats_after_train"], facts["memory_total"], facts["name"])
