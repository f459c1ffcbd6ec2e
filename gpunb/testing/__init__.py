"""Test support: a fake NVML built from real H200 readings (see ``fake_nvml``), and pretend GPU
memories for %gpufit's CPU tests: a byte budget (``fake_device_memory``), and the caching
allocator's blocks (``fake_caching_allocator``) charged by a training step's CPU stand-in
(``fake_training``)."""

from gpunb.testing.fake_caching_allocator import CachingMemory
from gpunb.testing.fake_device_memory import BudgetMemory
from gpunb.testing.fake_nvml import (
    FakeGpu,
    FakePynvml,
    load_trace,
    replay_allreduce,
    replay_clock,
    replay_probe,
    scenario,
)

__all__ = ["BudgetMemory", "CachingMemory", "FakeGpu", "FakePynvml", "load_trace", "replay_allreduce", "replay_clock",
           "replay_probe", "scenario"]
