"""Test support: a fake NVML built from real H200 readings (see ``fake_nvml``)."""

from gpunb.testing.fake_nvml import FakeGpu, FakePynvml, load_trace, replay_allreduce, replay_probe, scenario

__all__ = ["FakeGpu", "FakePynvml", "load_trace", "replay_allreduce", "replay_probe", "scenario"]
