"""``%gpufit`` leaves the user's training exactly as it found it, bit for bit: weights, BatchNorm
statistics, gradients, optimizer state and hyperparameters, a scheduler stepped inside the step,
a GradScaler, the RNGs (Python, NumPy, torch) and train()/eval() modes; after a normal fit, an
error in the step, a Ctrl-C in any trial, and a Ctrl-C during the restore itself.

The models are real torch models trained on the CPU; the device memory is the simulated budget
of ``gpunb.testing.fake_device_memory`` (each step charges what its GPU twin would use), so the
search runs its real trials. Before this, the trials trained the weights and left a
scheduler stepped inside the step ahead (issue 22).
"""

from __future__ import annotations

import signal

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit import user_state  # noqa: E402
from gpunb.analysis.fit.fresh_state import FreshStart  # noqa: E402
from gpunb.analysis.fit.search import fit_with_memory  # noqa: E402
from gpunb.testing.fake_device_memory import BudgetMemory  # noqa: E402
from tests.fit_state import MODELS, ConvNet, Mlp, differences, everything, interrupted_at  # noqa: E402

GiB = 2**30


def fit(t: object, **kw):
    return fit_with_memory(t.step, t.memory, capacity=2 * GiB, steps=4, max_trials=4, **kw)


@pytest.fixture(autouse=True)
def forget_last_fit():
    yield
    fit_search._LAST.clear()


@pytest.mark.parametrize("kind", MODELS)
def test_a_normal_fit_leaves_everything_as_it_was(kind):
    t = MODELS[kind](BudgetMemory(2 * GiB)).mid_training()
    before = everything(t)
    result = fit(t)
    assert result.ok and result.trial_count >= 3, result.trials
    assert differences(before, everything(t)) == []
    assert not [n for n in result.notes if "not restored" in n]


@pytest.mark.parametrize("kind", MODELS)
def test_an_error_in_the_step_leaves_everything_as_it_was(kind):
    t = MODELS[kind](BudgetMemory(2 * GiB)).mid_training()
    before = everything(t)
    real, calls = t.step, [0]

    def failing(batch):
        calls[0] += 1
        if calls[0] == 7:
            raise ValueError("my bug")
        real(batch)

    t.step = failing
    with pytest.raises(ValueError, match="my bug"):
        fit(t)
    t.step = real
    assert differences(before, everything(t)) == []


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("at_call", [1, 2, 5, 9, 14])
def test_a_ctrl_c_in_any_trial_leaves_everything_as_it_was(kind, at_call):
    t = MODELS[kind](BudgetMemory(2 * GiB)).mid_training()
    before = everything(t)
    real = t.step
    t.step, _ = interrupted_at(real, at_call)  # the interrupt lands after the step changed things
    with pytest.raises(KeyboardInterrupt):
        fit(t)
    t.step = real
    assert differences(before, everything(t)) == []


@pytest.mark.parametrize("where", ["optimizer restore", "model restore"])
def test_a_ctrl_c_during_the_restore_waits_until_everything_is_back(where, monkeypatch):
    t = Mlp(BudgetMemory(2 * GiB)).mid_training()
    before = everything(t)
    fired = []
    if where == "optimizer restore":
        real_restore = FreshStart.restore

        def restore(self, settle):
            signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, in the middle of the restore
            fired.append(True)
            real_restore(self, settle)

        monkeypatch.setattr(FreshStart, "restore", restore)
    else:
        real_back = user_state._back

        def back(saved):
            if not fired:
                signal.raise_signal(signal.SIGINT)
                fired.append(True)
            return real_back(saved)

        monkeypatch.setattr(user_state, "_back", back)
    with pytest.raises(KeyboardInterrupt):
        fit(t)
    assert fired
    assert differences(before, everything(t)) == []


def test_the_restore_is_idempotent():
    t = Mlp(BudgetMemory(2 * GiB)).mid_training()
    before = everything(t)
    saved = user_state.UserState.capture(torch, t.step)
    for _ in range(3):
        t.step(8)
    saved.restore()
    saved.restore()
    assert differences(before, everything(t)) == []


def test_it_says_in_one_line_what_it_could_not_save():
    t = ConvNet(BudgetMemory(2 * GiB)).mid_training()
    result = fit(t, host_available=lambda: 1000)  # a host with 1000 bytes free: no room for a copy
    notes = [n for n in result.notes if n.startswith("not restored")]
    assert len(notes) == 1 and "Sequential" in notes[0] and "\n" not in notes[0], result.notes


def test_it_finds_what_the_step_reaches():
    t = Mlp(BudgetMemory(GiB))
    reach = user_state.find_reachable(torch, t.step)
    assert reach.modules == [t.model] and reach.optimizers == [t.opt]
    assert reach.schedulers == [t.sched] and reach.scalers == [t.scaler]
    model, opt = t.model, t.opt

    def step(batch):  # a notebook function naming globals
        model(torch.zeros(batch, 16)).sum().backward()
        opt.step()

    reach = user_state.find_reachable(torch, step)
    assert reach.modules == [model] and reach.optimizers == [opt]
