"""One %gpufit trial on the CPU: a real torch training step charging a pretend GPU memory.

The step trains a small model with AdamW for real (so torch's global optimizer hooks fire,
the optimizer state appears at the first step, and a trial's fresh start empties it); the
memory numbers are the test's own, charged to ``gpunb.testing.BudgetMemory`` (a byte budget)
or to ``gpunb.testing.CachingMemory`` (the caching allocator's blocks, where the layout
decides whether a batch trains).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.fit import search as batch_fit  # noqa: E402
from gpunb.analysis.fit.fresh_state import FreshStart  # noqa: E402
from gpunb.analysis.fit.search import fit_with_memory, last_fit  # noqa: E402
from gpunb.analysis.fit.trial import run_trial  # noqa: E402
from gpunb.testing.fake_caching_allocator import CachingMemory  # noqa: E402
from gpunb.testing.fake_device_memory import BudgetMemory  # noqa: E402
from gpunb.testing.fake_training import GpuTwin, SimulatedTraining  # noqa: E402

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


def test_a_trial_runs_every_step_and_reads_peaks():
    mem = BudgetMemory(4 * GiB)
    step = ChargedStep(mem)
    before = hooks_registered()
    t = run_trial(step, 100, memory=mem, steps=10, index=1, purpose="probe", capacity=4 * GiB)
    assert hooks_registered() == before  # global hooks only while the steps ran
    assert t.ok and t.fits and t.steps_done == 10 == step.calls
    assert t.peak_allocated_bytes == 256 * MiB + 400 * MiB
    assert t.peak_before_step_bytes is not None and t.base_allocated_bytes == 256 * MiB
    assert t.verdict == "fits" and t.to_dict()["fits"] is True


def test_a_trial_starts_as_a_fresh_process_and_the_users_state_comes_back():
    mem = BudgetMemory(4 * GiB)
    step = ChargedStep(mem)
    for _ in range(3):  # the user trained before %gpufit: AdamW has state, the gradients exist
        step(4)
    step.opt.param_groups[0]["lr"] = 5e-4
    users = {k: v.clone() for k, v in step.opt.state[step.model[0].weight].items()}
    fresh = FreshStart(torch, device=torch.device("cpu"))
    first = run_trial(step, 8, memory=mem, steps=3, index=1, purpose="probe", fresh=fresh)
    assert first.state_reset_bytes == 0 and len(fresh.saved) == 1  # set aside at the first step it saw
    seen = []

    def watching(batch):
        seen.append((len(step.opt.state), [p.grad for p in step.model.parameters()]))
        step(batch)

    second = run_trial(watching, 8, memory=mem, steps=3, index=2, purpose="probe", fresh=fresh)
    assert second.fits and second.state_reset_bytes > 0
    assert seen[0] == (0, [None] * 4)  # the trial began with no state and no gradients, as a fresh process
    step.opt.param_groups[0]["lr"] = 1.0  # as a scheduler in the step would
    fresh.restore(mem.settle)
    state = step.opt.state[step.model[0].weight]
    assert set(state) == set(users) and all(torch.equal(state[k], users[k]) for k in users)
    assert step.opt.param_groups[0]["lr"] == 5e-4 and not fresh.saved
    assert all(p.grad is not None for p in step.model.parameters())  # as the last trial's step left them


def test_state_that_cannot_be_set_aside_stays_in_place_and_is_named():
    model = torch.nn.Linear(8, 8)
    fresh = FreshStart(torch)
    fresh.saw(torch.optim.Adam(model.parameters(), capturable=True))
    assert "capturable=True" in fresh.kept[0] and not fresh.saved
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    fresh = FreshStart(torch, host_available=lambda: 1024, device=torch.device("cpu"))
    fresh.saw(opt)
    assert "more than half of the free host memory" in fresh.kept[0]
    assert fresh.clear() == 0 and opt.state and model.weight.grad is not None  # left alone


def test_an_oom_mid_run_is_caught_freed_and_recorded_with_its_step():
    mem = BudgetMemory(GiB)
    step = ChargedStep(mem, per_sample=MiB, period=5, long=4.0)  # step 5 needs four times the memory
    t = run_trial(step, 300, memory=mem, steps=10, index=2, purpose="candidate", capacity=GiB)
    assert not t.ok and t.steps_done == 4 and "CUDA out of memory" in t.error
    assert t.verdict == "out of memory at step 5" and not t.fits
    assert t.peak_allocated_bytes == 256 * MiB + 300 * MiB  # the steps before the failure


def test_a_run_that_needed_the_cache_given_back_trained_and_says_so():
    # a fresh process gives its cache back the same way: recorded, not held against the batch
    mem = BudgetMemory(GiB, fragmentation=0.5)  # reserved runs 50 % above allocated
    step = ChargedStep(mem, per_sample=MiB)
    t = run_trial(step, 600, memory=mem, steps=4, index=1, purpose="candidate", capacity=GiB)
    assert t.fits and t.at_edge and t.cache_releases > 0 and "gave its cache back" in t.verdict


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
    seen = set()

    def autotuning(batch):
        if batch not in seen:
            seen.add(batch)
            mem.use(GiB - mem.kept)  # the workspace trial, up to the budget
            mem.settle()
        step(batch)

    t = run_trial(autotuning, 200, memory=mem, steps=5, index=1, purpose="probe", capacity=GiB)
    assert t.fits and not t.at_edge, t.verdict  # the steady steps had room
    assert t.first_step_peak_reserved_bytes == GiB and t.peak_reserved_bytes < GiB // 2
    assert t.peak_allocated_bytes == 256 * MiB + 200 * MiB


def test_on_cuda_the_allocators_retries_and_caught_ooms_are_the_pressure():
    import types

    from gpunb.analysis.fit.trial import CudaMemory

    stats = {"segment.all.freed": 7, "num_alloc_retries": 2, "num_ooms": 1}  # empty_cache() frees segments too
    fake = types.SimpleNamespace(device=lambda *a: "cuda:0", cuda=types.SimpleNamespace(memory_stats=lambda i: stats))
    assert CudaMemory(fake, 0).pressure() == (2, 1)


def test_errors_that_are_not_oom_are_the_users():
    mem = BudgetMemory(GiB)
    before = hooks_registered()

    def broken(batch):
        raise ValueError("shape mismatch in my model")

    with pytest.raises(ValueError, match="shape mismatch"):
        run_trial(broken, 8, memory=mem, steps=5, index=1, purpose="probe")
    assert hooks_registered() == before


def test_the_whole_search_on_a_pretend_gpu_recommends_a_batch_that_trains():
    mem = BudgetMemory(6 * GiB, fragmentation=0.05)
    step = ChargedStep(mem, per_sample=2 * MiB, period=10, long=1.5)
    fit = fit_with_memory(step, mem, capacity=6 * GiB, steps=20, progress=None)
    # the largest batch that trains: the long batch (x1.5) in 6 GiB - 256 MiB of pretend memory
    true_max = int((6 * GiB - 256 * MiB) / (1.5 * 2 * MiB))
    assert fit.ok and fit.steps == 20 and fit.trial_count <= 6, fit.trials
    assert 0.9 * true_max <= fit.recommended <= true_max, (fit.recommended, true_max, fit.trials)
    assert fit.verified_trial.fits and fit.recommended == int(fit.verified * 0.97) and fit.headroom_bytes >= 0
    assert last_fit() is fit and fit.step_name == "ChargedStep"
    assert fit.seconds > 0


def test_margin_keeps_that_share_free():
    mem = BudgetMemory(6 * GiB)
    step = ChargedStep(mem, per_sample=2 * MiB)
    fit = fit_with_memory(step, mem, capacity=6 * GiB, steps=5, margin=0.2, progress=None)
    assert fit.ok and fit.capacity_bytes == int(6 * GiB * 0.8)
    assert fit.verified_trial.peak_allocated_bytes <= 0.8 * 6 * GiB
    assert any("kept free (--margin)" in n for n in fit.notes)
    batch_fit._LAST.clear()


# -- the layout of a fresh process (the simulated caching allocator) ----------------------------------

# The zoo's MLP as the GPU runs it: 1024-4096-4096-1024 in fp32 (25 M parameters), AdamW, a 4 GiB cap
MLP = GpuTwin(params=(16 * MiB, 16 * 2**10, 64 * MiB, 16 * 2**10, 16 * MiB, 4 * 2**10), inputs=(4096, 4096),
              layers=((16384, (0, 1)), (16384, ()), (16384, (2, 3)), (16384, ()), (4096, (4, 5))))


def fresh_process():
    return SimulatedTraining(MLP, CachingMemory(4 * GiB))


def long_lived():
    """A process that trained at a tiny batch first: AdamW's state sits in segments of its own."""
    model = fresh_process()
    for _ in range(3):
        model.step(2)
    model.memory.settle()
    return model


def trains(model, batch, steps=5):
    """How many steps ``model`` trained at ``batch`` before running out of memory."""
    for i in range(steps):
        try:
            model.step(batch)
        except torch.OutOfMemoryError:
            return i
    return steps


def largest(fits, lo=1000):
    """The largest batch for which ``fits`` holds, by doubling then bisection."""
    hi = lo * 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def relocated_after_step_1(model, batch):
    """Round 1's trial in block terms: after the first step each state tensor moved to a new block
    (where best fit puts it then), the cache emptied, then the rest of the run."""
    if trains(model, batch, 1) < 1:
        return 0
    mem = model.memory
    for state in model.optimizer.state.values():
        for t in (state["exp_avg"], state["exp_avg_sq"]):
            old = mem._ties[id(t)]
            mem._ties[id(t)] = [mem.alloc(b.size) for b in old]
            for b in old:
                mem.free(b)
    mem.settle()
    return 1 + trains(model, batch, 4)


def test_a_fresh_process_fails_at_step_2_where_the_fitting_process_trains_and_a_fresh_start_sees_it():
    fresh_max = largest(lambda b: trains(fresh_process(), b) == 5)
    same_max = largest(lambda b: trains(long_lived(), b) == 5)
    assert same_max > 1.1 * fresh_max  # the mode: AdamW's state carved out of step 1's freed activations
    batch = (fresh_max + same_max) // 2
    assert trains(fresh_process(), batch) == 1  # a fresh process: out of memory at step 2
    # round 1 (state relocated after step 1) trains it, so it recommended batches that crash
    assert relocated_after_step_1(long_lived(), batch) == 5
    model = long_lived()
    fresh = FreshStart(torch, device=torch.device("cpu"))
    t = run_trial(model.step, 2, memory=model.memory, steps=3, index=1, purpose="probe", fresh=fresh)
    assert t.fits and len(fresh.saved) == 1  # the first trial learns which optimizer the step uses
    t = run_trial(model.step, batch, memory=model.memory, steps=5, index=2, purpose="candidate", fresh=fresh)
    assert not t.fits and t.steps_done == 1  # from then on every trial starts as a fresh process
    assert t.state_reset_bytes > 0  # AdamW's state was emptied (the stand-in's own bytes: the real tensors')
    fresh.restore(model.memory.settle)


def test_the_fit_recommends_what_trains_in_a_fresh_process_and_leaves_the_optimizer_as_it_was():
    fresh_max = largest(lambda b: trains(fresh_process(), b, 20) == 20)
    model = long_lived()
    users = {k: v.clone() for k, v in model.optimizer.state[model.module[2]].items()}
    fit = fit_with_memory(model.step, model.memory, capacity=4 * GiB, steps=20)
    assert fit.ok and fit.trial_count <= 6, fit.trials
    assert 0.9 * fresh_max <= fit.recommended <= fresh_max, (fit.recommended, fresh_max, fit.trials)
    assert trains(fresh_process(), fit.recommended, 20) == 20
    state = model.optimizer.state[model.module[2]]
    assert all(torch.equal(state[k], users[k]) for k in users)  # AdamW's own state is back
    assert trains(model, fit.recommended, 20) == 20  # and the fitting process trains the answer too
    batch_fit._LAST.clear()


def test_on_cuda_a_fresh_start_also_drops_cublas_workspaces():
    # a fresh process allocates cuBLAS's workspace at its first matrix product, inside step 1
    import types

    calls = []
    fake = types.SimpleNamespace(Tensor=torch.Tensor, no_grad=torch.no_grad, _C=types.SimpleNamespace(
        _cuda_clearCublasWorkspaces=lambda: calls.append("clear")),
        cuda=types.SimpleNamespace(synchronize=lambda device: calls.append("sync")))
    FreshStart(fake, device=torch.device("cuda", 0)).clear()
    assert calls == ["sync", "clear"]
    FreshStart(fake, device=torch.device("cpu")).clear()
    assert calls == ["sync", "clear"]  # only on a CUDA device
    # and once more when the fit ends, before the cache goes back: the last trial's workspace
    # would otherwise pin one of its large segments
    FreshStart(fake, device=torch.device("cuda", 0)).restore(lambda: calls.append("settle"))
    assert calls == ["sync", "clear", "sync", "clear", "settle"]
