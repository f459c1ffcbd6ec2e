"""One %gpufit trial on the CPU: a real torch training step charging a pretend GPU memory.

The step trains a small model with AdamW for real (so torch's global optimizer hooks fire,
the optimizer state appears at the first step and is relocated); the memory numbers are the
test's own, charged to ``gpunb.testing.fake_device_memory.BudgetMemory``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis import batch_fit  # noqa: E402
from gpunb.analysis.batch_fit import fit_with_memory, last_fit  # noqa: E402
from gpunb.analysis.fit_trial import relocate_persistent, run_trial  # noqa: E402
from gpunb.testing.fake_device_memory import BudgetMemory  # noqa: E402

MiB = 2**20
GiB = 2**30


class ChargedStep:
    """A training step of a small real model; a GPU twin would use ``fixed + per_sample * b``
    bytes (times ``long`` on every ``period``-th step: a long sequence now and then)."""

    def __init__(self, memory, per_sample=4 * MiB, fixed=256 * MiB, period=0, long=1.0):
        torch.manual_seed(0)
        self.memory, self.per_sample, self.period, self.long = memory, per_sample, period, long
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        memory.keep(fixed)
        self.calls = 0

    def __call__(self, batch):
        factor = self.long if self.period and self.calls % self.period == self.period - 1 else 1.0
        self.calls += 1
        self.opt.zero_grad(set_to_none=True)
        x = torch.randn(min(batch, 64), 16)
        self.model(x).square().mean().backward()
        self.memory.use(int(self.per_sample * batch * factor))  # may raise the pretend OOM
        self.opt.step()


def hooks_registered():
    from torch.optim import optimizer as o

    return len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks)


def test_a_trial_runs_every_step_reads_peaks_and_relocates_the_optimizer_state():
    mem = BudgetMemory(4 * GiB)
    step = ChargedStep(mem)
    before = hooks_registered()
    t = run_trial(step, 100, memory=mem, steps=10, index=1, purpose="probe", capacity=4 * GiB)
    assert hooks_registered() == before  # global hooks only while the steps ran
    assert t.ok and t.clean and t.steps_done == 10 == step.calls
    assert t.peak_allocated_bytes == 256 * MiB + 400 * MiB
    assert t.peak_before_step_bytes is not None and t.base_allocated_bytes == 256 * MiB
    # AdamW's state (exp_avg, exp_avg_sq, step) and the gradients, kept between steps here (zero_grad
    # comes first in the step): what a fresh process creates during its first step
    state = [v for s in step.opt.state.values() for v in s.values() if torch.is_tensor(v)]
    grads = [p.grad for p in step.model.parameters()]
    assert state and t.relocated_bytes == sum(v.nbytes for v in state + grads)
    assert t.verdict == "fits"


def test_relocation_keeps_values_and_tensor_objects():
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    state = opt.state[model.weight]
    ids = {k: id(v) for k, v in state.items()}
    values = {k: v.clone() for k, v in state.items()}
    grad = model.weight.grad
    ptr = grad.data_ptr()
    moved = relocate_persistent([opt], torch.device("cpu"), torch)
    assert moved > 0 and grad.data_ptr() != ptr and model.weight.grad is grad
    for k, v in state.items():
        assert id(v) == ids[k] and torch.equal(v, values[k])
    capturable = torch.optim.Adam(model.parameters(), capturable=True)
    assert relocate_persistent([capturable], torch.device("cpu"), torch) == 0  # a CUDA graph may hold them


def test_an_oom_mid_run_is_caught_freed_and_recorded_with_its_step():
    mem = BudgetMemory(GiB)
    step = ChargedStep(mem, per_sample=MiB, period=5, long=4.0)  # step 5 needs four times the memory
    t = run_trial(step, 300, memory=mem, steps=10, index=2, purpose="candidate", capacity=GiB)
    assert not t.ok and t.steps_done == 4 and "CUDA out of memory" in t.error
    assert t.verdict == "out of memory at step 5" and not t.clean
    assert t.peak_allocated_bytes == 256 * MiB + 300 * MiB  # the steps before the failure


def test_a_run_that_needed_the_cache_given_back_is_not_clean():
    mem = BudgetMemory(GiB, fragmentation=0.5)  # reserved runs 50 % above allocated
    step = ChargedStep(mem, per_sample=MiB)
    t = run_trial(step, 600, memory=mem, steps=4, index=1, purpose="candidate", capacity=GiB)
    assert t.ok and t.cache_releases > 0 and not t.clean and "released its cache" in t.verdict


def test_a_sustained_run_sees_the_long_batch_a_short_one_misses():
    mem = BudgetMemory(8 * GiB)
    step = ChargedStep(mem, per_sample=MiB, period=10, long=2.0)
    short = run_trial(step, 100, memory=mem, steps=3, index=1, purpose="probe")
    step.calls = 0
    full = run_trial(step, 100, memory=mem, steps=50, index=2, purpose="probe")
    assert short.peak_allocated_bytes == 256 * MiB + 100 * MiB
    assert full.peak_allocated_bytes == 256 * MiB + 200 * MiB


def test_the_first_step_of_a_shape_is_kept_apart():
    # cuDNN times its algorithms on the first call of a shape: it tries a workspace as large as
    # the device allows (here the whole budget: the cache is given back) and empties the cache
    mem = BudgetMemory(GiB, fragmentation=0.02)
    step = ChargedStep(mem, per_sample=MiB)
    real_call = step.__call__
    seen = set()

    def autotuning(batch):
        if batch not in seen:
            seen.add(batch)
            mem.use(GiB - mem.kept)  # the workspace trial, up to the budget
            mem.settle()
        real_call(batch)

    t = run_trial(autotuning, 200, memory=mem, steps=5, index=1, purpose="probe", capacity=GiB)
    assert t.ok and t.clean, t.verdict  # the steady steps had room
    assert t.first_step_peak_reserved_bytes == GiB and t.peak_reserved_bytes < GiB // 2
    assert t.peak_allocated_bytes == 256 * MiB + 200 * MiB


def test_with_cudnn_benchmark_only_the_allocators_retries_count_as_pressure():
    import types

    from gpunb.analysis.fit_trial import CudaMemory

    stats = {"segment.all.freed": 7, "num_alloc_retries": 2, "num_ooms": 1}
    fake = types.SimpleNamespace(device=lambda *a: "cuda:0", backends=types.SimpleNamespace(
        cudnn=types.SimpleNamespace(benchmark=False)), cuda=types.SimpleNamespace(memory_stats=lambda i: stats))
    mem = CudaMemory(fake, 0)
    assert mem.pressure() == (7, 1)
    fake.backends.cudnn.benchmark = True  # cuDNN empties the cache itself when it times a shape
    assert mem.pressure() == (2, 1)


def test_errors_that_are_not_oom_are_the_users():
    mem = BudgetMemory(GiB)
    before = hooks_registered()

    def broken(batch):
        raise ValueError("shape mismatch in my model")

    with pytest.raises(ValueError, match="shape mismatch"):
        run_trial(broken, 8, memory=mem, steps=5, index=1, purpose="probe")
    assert hooks_registered() == before


def test_the_whole_search_on_a_pretend_gpu_recommends_a_batch_whose_run_is_clean():
    mem = BudgetMemory(6 * GiB, fragmentation=0.05)
    step = ChargedStep(mem, per_sample=2 * MiB, period=10, long=1.5)
    fit = fit_with_memory(step, mem, capacity=6 * GiB, steps=20, progress=None)
    # the clean maximum: the long batch (x1.5) with 5 % overhead in 6 GiB - 256 MiB, 2 MiB rounding
    room = 6 * GiB - 256 * MiB - 2 * MiB
    clean_max = int(room / (1.5 * 2 * MiB * 1.05))
    assert fit.ok and fit.steps == 20 and fit.trial_count <= 6, fit.trials
    assert 0.9 * clean_max <= fit.recommended <= clean_max, (fit.recommended, clean_max, fit.trials)
    assert fit.recommended_trial.clean and fit.headroom_bytes >= 0
    assert last_fit() is fit and fit.step_name == "ChargedStep"
    assert fit.seconds > 0


def test_margin_keeps_that_share_free():
    mem = BudgetMemory(6 * GiB)
    step = ChargedStep(mem, per_sample=2 * MiB)
    fit = fit_with_memory(step, mem, capacity=6 * GiB, steps=5, margin=0.2, progress=None)
    assert fit.ok and fit.capacity_bytes == int(6 * GiB * 0.8)
    assert fit.recommended_trial.peak_reserved_bytes <= 0.8 * 6 * GiB
    assert any("kept free (--margin)" in n for n in fit.notes)
    batch_fit._LAST.clear()
