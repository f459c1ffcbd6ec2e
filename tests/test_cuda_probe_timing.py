"""The CUDA probe times the GPU, not the host's gaps: checked on a simulated stream.

While the probe's GPU measurements run, a second thread imports ``torch._dynamo`` (torch.optim
needs it, and it costs seconds of Python), so the measuring thread may wait milliseconds for
the GIL between two launches. A CUDA-event pair would then count the GPU's idle time. The
probe's ``GpuClock`` queues the work behind a spin kernel and repeats the measurement with a
longer spin when the spin ended before everything was queued. The simulation below is a
stream as CUDA runs it: each launch starts when both the GPU is free and the host has queued
it; an event completes when the stream reaches it.
"""

from __future__ import annotations

import types

import pytest

from gpunb.readings import cuda_probe_script as probe


class SimulatedCuda:
    """One stream; times in ms. ``stall_ms``: host time lost per launch (a GIL wait)."""

    def __init__(self, stall_ms: float, cycles_per_ms: float = 1.98e6) -> None:
        self.host = 0.0
        self.gpu = 0.0
        self.stall_ms = stall_ms
        self.cycles_per_ms = cycles_per_ms
        self.launches = 0
        sim = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = None

            def record(self) -> None:
                self.t = max(sim.gpu, sim.host)
                sim.gpu = self.t

            def query(self) -> bool:
                return self.t <= sim.host

            def synchronize(self) -> None:
                sim.host = max(sim.host, self.t)

            def elapsed_time(self, other) -> float:
                return other.t - self.t

        class device:  # noqa: N801 (torch.cuda.device)
            def __init__(self, dev) -> None:
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc) -> None:
                return None

        self.cuda = types.SimpleNamespace(
            Event=Event, device=device, _sleep=lambda cycles: self.launch(cycles / self.cycles_per_ms, stall=False),
            synchronize=lambda *a: setattr(self, "host", max(self.host, self.gpu)))

    def launch(self, gpu_ms: float, stall: bool = True) -> None:
        self.host += 0.01 + (self.stall_ms if stall else 0.0)  # queueing takes host time
        start = max(self.gpu, self.host)
        self.gpu = start + gpu_ms
        self.launches += 1


def test_a_stalled_host_does_not_inflate_the_gpu_time():
    sim = SimulatedCuda(stall_ms=5.0)  # 5 ms of GIL wait per launch, the switch interval
    clock = probe.GpuClock(sim, "cuda:0")
    assert clock.cycles_per_ms == pytest.approx(1.98e6, rel=1e-6)
    ms = clock.time(lambda: sim.launch(1.4), iters=10, busy=True)
    assert ms == pytest.approx(1.4, rel=1e-6)


def test_the_spin_is_lengthened_until_the_host_keeps_ahead():
    sim = SimulatedCuda(stall_ms=20.0)  # far worse than the first spin covers
    clock = probe.GpuClock(sim, "cuda:0")
    ms = clock.time(lambda: sim.launch(1.4), iters=10, busy=False)
    assert ms == pytest.approx(1.4, rel=1e-6)


def test_without_the_spin_the_same_stall_would_be_counted():
    """The control: what a plain event pair measures on the same stream."""
    sim = SimulatedCuda(stall_ms=5.0)
    start, end = sim.cuda.Event(True), sim.cuda.Event(True)
    start.record()
    for _ in range(10):
        sim.launch(1.4)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) / 10 > 4.9


def test_a_torch_without_the_spin_kernel_times_plainly():
    sim = SimulatedCuda(stall_ms=0.0)
    del sim.cuda._sleep
    clock = probe.GpuClock(sim, "cuda:0")
    assert clock.cycles_per_ms is None
    assert clock.time(lambda: sim.launch(2.0), iters=5) == pytest.approx(2.0, rel=1e-3)


def test_the_smoke_test_and_matmul_run_end_to_end_on_a_stand_in():
    """The probe's measurement code on CPU tensors behind a stand-in ``torch.cuda`` (host-clock
    events, no spin kernel): every figure the checks read is there and consistent."""
    import torch

    from tests.simulated_cuda import HostClockEvent

    class Cuda:
        Event = HostClockEvent

        @staticmethod
        def synchronize(*a):
            return None

        @staticmethod
        def is_bf16_supported():
            return True

        @staticmethod
        def empty_cache():
            return None

        @staticmethod
        def device(dev):
            return SimulatedCuda(0).cuda.device(dev)

    class Torch:
        cuda = Cuda

        def __getattr__(self, name):
            return getattr(torch, name)

    stand_in = Torch()
    clock = probe.GpuClock(stand_in, "cpu")
    importer = probe.OptimizerImport()
    smoke = probe.smoke(stand_in, "cpu", clock, importer)
    assert smoke["loss_finite"] and smoke["step_ms_median"] > 0
    assert smoke["first_step_ms"] == pytest.approx(
        smoke["first_forward_ms"] + smoke["first_backward_ms"] + smoke["first_optimizer_step_ms"])
    assert smoke["optimizer_import_ms"] is not None and "module_loading" in smoke
    mm = probe.matmul(stand_in, "cpu", clock, busy=False, n=256)
    assert all(mm[k] and mm[k] > 0 for k in ("bf16_tflops", "tf32_tflops", "fp32_tflops"))
