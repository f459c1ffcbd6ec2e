"""Test support: a fake NVML built from real H200 readings (see ``fake_nvml``), and a pretend GPU
memory with a byte budget for %gpufit's CPU tests (``fake_device_memory``)."""

from gpunb.testing.fake_device_memory import BudgetMemory
from gpunb.testing.fake_nvml import FakeGpu, FakePynvml, load_trace, replay_probe, scenario

__all__ = ["BudgetMemory", "FakeGpu", "FakePynvml", "load_trace", "replay_probe", "scenario"]
