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

import copy
import random
import signal

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit import user_state  # noqa: E402
from gpunb.analysis.fit.fresh_state import FreshStart  # noqa: E402
from gpunb.analysis.fit.search import fit_with_memory  # noqa: E402
from gpunb.testing.fake_device_memory import BudgetMemory  # noqa: E402

GiB, MiB = 2**30, 2**20


class ConvNet:
    """A BatchNorm conv net with SGD (momentum) and a StepLR stepped inside the step; the user
    left it in eval() mode, the step switches it to train()."""

    def __init__(self, memory: BudgetMemory) -> None:
        torch.manual_seed(1)
        self.memory = memory
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.9)
        memory.keep(64 * MiB)

    def step(self, batch: int) -> None:
        self.memory.use(3 * MiB * batch)
        self.model.train()
        x = torch.randn(min(batch, 64), 3, 8, 8)
        loss = self.model(x).square().mean() + random.random() * 0 + float(np.random.rand()) * 0
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()

    def mid_training(self) -> ConvNet:
        for _ in range(3):
            self.step(4)
        self.model.eval()
        return self


class Mlp:
    """An MLP with AdamW, a OneCycleLR stepped inside the step and a GradScaler."""

    def __init__(self, memory: BudgetMemory) -> None:
        torch.manual_seed(2)
        self.memory = memory
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                         torch.nn.Linear(32, 4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=0.01, total_steps=10_000)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
        memory.keep(32 * MiB)

    def step(self, batch: int) -> None:
        self.memory.use(2 * MiB * batch)
        x = torch.randn(min(batch, 64), 16)
        loss = self.model(x).square().mean()
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()

    def mid_training(self) -> Mlp:
        for _ in range(5):
            self.step(4)
        return self


MODELS = {"convnet": ConvNet, "mlp": Mlp}


def everything(t: object) -> dict[str, object]:
    """What the user could look at afterwards, copied."""
    out: dict[str, object] = {
        "model": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in t.model.named_parameters()},
        "modes": [m.training for m in t.model.modules()],
        "optimizer": copy.deepcopy(t.opt.state_dict()),
        "scheduler": copy.deepcopy(t.sched.state_dict()),
        "python rng": random.getstate(),
        "numpy rng": np.random.get_state(),
        "torch rng": torch.get_rng_state(),
    }
    if hasattr(t, "scaler"):
        out["scaler"] = copy.deepcopy(t.scaler.state_dict())
    return out


def differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.view(torch.uint8) if a.dtype.is_floating_point and a.dim() else a,
            b.view(torch.uint8) if b.dtype.is_floating_point and b.dim() else b)
        return [] if same else [path]
    if isinstance(a, np.ndarray):
        return [] if np.array_equal(a, b) else [path]
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return [path + " (keys)"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [path + " (length)"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


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
    real, calls = t.step, [0]

    def interrupted(batch):
        calls[0] += 1
        real(batch)  # the interrupt lands after the step changed things
        if calls[0] == at_call:
            raise KeyboardInterrupt

    t.step = interrupted
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
