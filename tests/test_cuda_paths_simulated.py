"""The CUDA code paths of %gpufit and the OOM hook, run on CPU against a simulated allocator.

The numbers are the simulation's (a step that needs fixed + per_sample * batch bytes); what
is tested is that the code that talks to ``torch.cuda`` calls it correctly and turns its
readings into the right result: real numbers come from tests/gpu/test_oom_gpu.py on the H200.
"""

from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")

from gpunb.testing.fake_nvml import load_trace  # noqa: E402

GiB = 2**30
MiB = 2**20
TRACE = load_trace()


class SimulatedAllocator:
    def __init__(self, total, fixed, per_sample, overhead=0.03):
        self.total, self.fixed, self.per_sample, self.overhead = total, fixed, per_sample, overhead
        self.allocated = fixed
        self.peak = fixed
        self.calls = []

    def step(self, batch):
        self.calls.append(batch)
        need = self.fixed + self.per_sample * batch
        if need * (1 + self.overhead) > self.total:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {self.per_sample * batch / GiB:.2f} GiB. GPU 0 has a total "
                f"capacity of {self.total / GiB:.2f} GiB of which 1.00 GiB is free.")
        self.peak = max(self.peak, need)

    def install(self, monkeypatch):
        cuda = torch.cuda
        sim = self
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: 1)
        monkeypatch.setattr(cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cuda, "device", lambda index: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (sim.total - sim.fixed, sim.total))
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: sim.fixed)
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: sim.allocated)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: setattr(sim, "peak", sim.allocated))
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: sim.peak)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: int(sim.peak * 1.02))
        monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)
        stats = dict(TRACE["memory_stats_after_train"])
        monkeypatch.setattr(cuda, "memory_stats", lambda device=None: stats)
        props = types.SimpleNamespace(uuid=TRACE["facts"]["uuid"].removeprefix("GPU-"))
        monkeypatch.setattr(cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "NVIDIA H200 (simulated)")


def test_fit_batch_size_drives_torch_cuda_and_finds_the_limit(monkeypatch, fake_nvml):
    from gpunb import fit_batch_size

    sim = SimulatedAllocator(total=140 * GiB, fixed=12 * GiB, per_sample=37 * MiB)
    sim.install(monkeypatch)
    said = []
    fit = fit_batch_size(sim.step, steps=2, progress=said.append)
    true_max = int((140 * GiB / 1.03 - 12 * GiB) / (37 * MiB))
    assert fit.ok and fit.device == "cuda:0"
    assert 0.9 * true_max <= fit.recommended <= true_max
    assert fit.trial_count <= 6 and fit.trials[0].batch == 2 and fit.trials[1].batch == 16
    assert all(t.steps_done >= 2 for t in fit.trials if t.ok)  # steps=2 per trial
    assert sim.calls == []  # the step's own list, reachable through its `self`, is given back as it was
    assert any("fits, peak" in s for s in said) and any("trial 1" in s for s in said)
    assert any(s.startswith("done: ") and f"recommended batch: {fit.recommended}" in s for s in said)
    # a non-OOM error in the user's step is the user's: it propagates unchanged
    with pytest.raises(ZeroDivisionError):
        fit_batch_size(lambda bs: 1 / 0, progress=False)


def test_fit_respects_the_per_process_memory_fraction(monkeypatch, fake_nvml):
    from gpunb import fit_batch_size

    sim = SimulatedAllocator(total=140 * GiB, fixed=2 * GiB, per_sample=10 * MiB)
    sim.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 0.25)
    fit = fit_batch_size(sim.step, steps=3, progress=False)
    assert fit.capacity_bytes == int(0.25 * 140 * GiB)
    assert any("set_per_process_memory_fraction" in n for n in fit.notes)


def test_bad_device_is_explained(monkeypatch, fake_nvml):
    from gpunb import fit_batch_size

    SimulatedAllocator(140 * GiB, GiB, MiB).install(monkeypatch)
    assert "does not exist" in fit_batch_size(lambda b: None, device="cuda:3", progress=False).problem
    assert "CUDA device" in fit_batch_size(lambda b: None, device="cpu", progress=False).problem
    assert "not a torch device" in fit_batch_size(lambda b: None, device="gpu:x", progress=False).problem


def test_oom_hook_reads_allocator_and_nvml_on_the_cuda_path(monkeypatch, fake_nvml, ip, capsys):
    sim = SimulatedAllocator(140 * GiB, 6 * GiB, MiB)
    sim.install(monkeypatch)
    ip.user_ns["_gpunb_test"] = {"msg": TRACE["oom_message"]}
    ip.run_cell("import torch\ndef f():\n    raise torch.OutOfMemoryError(_gpunb_test['msg'])\nf()")
    out = capsys.readouterr().out
    assert "gpunb OOM doctor" in out and "could not diagnose" not in out
    d = ip._gpunb_extension_state.kernel.last_oom
    assert d.torch_memory is not None and d.torch_memory.reserved_bytes == TRACE[
        "memory_stats_after_train"]["reserved_bytes.all.current"]
    assert d.release.before.torch_allocated_bytes == 6 * GiB
    # NVML was asked about the GPU matched by UUID (the recorded H200); our PID is not in its trace
    assert fake_nvml.calls.get("nvmlDeviceGetComputeRunningProcesses", 0) >= 1
    report = __import__("gpunb").memory(shell=ip)
    assert report.gpus and report.gpus[0].name == "NVIDIA H200 (simulated)"
    assert report.gpus[0].total_bytes == TRACE["facts"]["memory_total"]
    assert "this kernel" in report._repr_mimebundle_()["text/plain"]


def test_the_optimizer_hook_reads_the_forward_backward_peak(monkeypatch, fake_nvml):
    """At small batches the optimizer step sets the peak; the pre-step hook sees the part that grows."""
    from torch.optim import optimizer as optim_module

    from gpunb import fit_batch_size

    params = 2 * GiB
    # weights + Adam state (4 x params) live between steps; backward adds the gradients
    sim = SimulatedAllocator(total=60 * GiB, fixed=4 * params, per_sample=5 * MiB, overhead=0.02)
    sim.install(monkeypatch)
    w = torch.nn.Parameter(torch.zeros(3))

    class SimulatedSGD(torch.optim.SGD):
        def step(self, closure=None):  # the pre-step hook reads the peak before this
            super().step(closure)
            sim.peak = max(sim.peak, sim.fixed + 3 * params)  # grads + foreach temporaries: batch-independent

    opt = SimulatedSGD([w], lr=0.1)

    def step(batch):
        sim.step(batch)  # may raise the OOM: fixed + per_sample * batch (+ overhead) over the total
        if (sim.fixed + params + sim.per_sample * batch) * 1.02 > sim.total:  # backward holds the grads too
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        sim.peak = max(sim.peak, sim.fixed + params + sim.per_sample * batch)  # forward + backward + grads
        w.grad = torch.ones(3)
        opt.step()

    hooks_before = len(optim_module._global_optimizer_pre_hooks)
    fit = fit_batch_size(step, steps=3, progress=False)
    assert len(optim_module._global_optimizer_pre_hooks) == hooks_before  # removed after each trial
    assert fit.trials[0].peak_before_step_bytes < fit.trials[0].peak_allocated_bytes  # the optimizer's peak
    assert fit.trials[0].base_allocated_bytes == sim.fixed
    true_max = int((60 * GiB / 1.02 - 5 * params) / (5 * MiB))  # the simulated OOM rule
    assert 0.9 * true_max <= fit.recommended <= true_max and fit.trial_count <= 6, fit.trials


def test_the_h200_mlp_shape_through_the_cuda_path(monkeypatch, fake_nvml):
    """The MLP that %gpufit missed on the H200 (run 2): at batch 2-16 the gradients set the
    forward+backward peak (+135 KB/sample), the activations (660 KB/sample) only at large batches."""
    from gpunb import fit_batch_size

    base, grads, cap = 1_679_581_184, 537_142_272, 37_527_470_080  # recorded: step start, grads, 0.25 cap
    sim = SimulatedAllocator(total=cap, fixed=base, per_sample=660_000, overhead=0.035)
    sim.install(monkeypatch)
    w = torch.nn.Parameter(torch.zeros(3))

    class SimulatedAdamW(torch.optim.SGD):
        def step(self, closure=None):  # the pre-step hook reads the forward+backward peak before this
            super().step(closure)
            sim.peak = max(sim.peak, base + 2 * grads)  # AdamW's foreach temporaries

    opt = SimulatedAdamW([w], lr=0.1)

    def step(batch):
        sim.step(batch)  # the activations' OOM rule
        fb = max(base + grads + 135_168 * batch, base + 660_000 * batch)
        if fb * 1.035 > cap:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
        sim.peak = max(sim.peak, fb)
        w.grad = torch.ones(3)
        opt.step()

    fit = fit_batch_size(step, steps=3, progress=False)
    true_max = int((cap / 1.035 - base) / 660_000)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert [m[2] for m in moves][:3] == ["probe", "probe", "scout"], moves
    assert 0.9 * true_max <= fit.recommended <= true_max and fit.trial_count <= 6, (moves, true_max)
