"""On the GPU: ``gpunb.fit_batch_size`` on a model outside the zoo, reached the ways a notebook
hands it over, leaves a full state digest unchanged after a fit and after a Ctrl-C (issue 29).

The setup (none of it in tests/fit_state.py's zoo): a small Transformer encoder held three levels
deep in a ``Trainer`` instance (``trainer.parts['net'].encoder``) and left in eval(); an Adam
optimizer that also trains a bare tensor (a learned temperature no module holds); a
CosineAnnealingLR stepped inside the step; a CUDA ``torch.Generator`` drawing the inputs, a
NumPy ``Generator`` and a ``random.Random`` the step draws from; a list the step appends its
losses to; the step handed over as ``functools.partial(train_step, trainer=trainer)``. The
digest: weights, buffers, gradients, the bare tensor and its gradient, optimizer state and
hyperparameters, scheduler state, every generator's state (the CUDA generator object, the
global Python, NumPy, torch CPU and CUDA ones), every module's mode and the loss list.

Run on the GPU machine (about a minute on one H200):
    python -m pytest -m gpu tests/gpu/test_fit_reach_gpu.py -v
Results: $GPUNB_RESULTS/fit_reach_gpu.json.
"""

from __future__ import annotations

import copy
import functools
import random
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit.search import fit_batch_size  # noqa: E402
from tests.fit_state import differences, interrupted_at  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402

RESULTS: dict[str, object] = {}
SEQ, WIDTH = 512, 1024


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 16, 4 * WIDTH, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = torch.nn.BatchNorm1d(WIDTH)  # running statistics: buffers a trial changes
        self.head = torch.nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x).mean(1)
        return self.head(self.norm(h))


class Trainer:
    def __init__(self) -> None:
        torch.manual_seed(7)
        net = Encoder().cuda()
        self.parts = {"net": net}
        self.temperature = torch.ones(1, device="cuda", requires_grad=True)  # held by no module
        self.opt = torch.optim.Adam([*net.parameters(), self.temperature], lr=1e-4)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=1000)
        self.gen = torch.Generator(device="cuda").manual_seed(11)
        self.np_gen = np.random.default_rng(12)
        self.rand = random.Random(13)
        self.losses: list[float] = []


def train_step(batch: int, *, trainer: Trainer) -> None:
    net = trainer.parts["net"]
    net.train()
    x = torch.randn(batch, SEQ, WIDTH, device="cuda", generator=trainer.gen)
    y = torch.randint(0, 8, (batch,), device="cuda", generator=trainer.gen)
    loss = torch.nn.functional.cross_entropy(net(x) / trainer.temperature, y)
    trainer.opt.zero_grad()
    loss.backward()
    trainer.opt.step()
    trainer.sched.step()
    trainer.np_gen.random()
    trainer.rand.random()
    trainer.losses.append(loss.item())


def digest(t: Trainer) -> dict[str, object]:
    net = t.parts["net"]
    return {
        "state": {k: v.detach().clone() for k, v in net.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()},
        "temperature": [t.temperature.detach().clone(),
                        None if t.temperature.grad is None else t.temperature.grad.clone()],
        "modes": [m.training for m in net.modules()],
        "optimizer": copy.deepcopy(t.opt.state_dict()),
        "scheduler": copy.deepcopy(t.sched.state_dict()),
        "cuda generator": t.gen.get_state().clone(),
        "numpy generator": copy.deepcopy(t.np_gen.bit_generator.state),
        "random.Random": t.rand.getstate(),
        "losses": list(t.losses),
        "python rng": random.getstate(),
        "numpy rng": np.random.get_state(),
        "torch rng": torch.get_rng_state(),
        "cuda rng": torch.cuda.get_rng_state_all(),
    }


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    save_json("fit_reach_gpu.json", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "cases": RESULTS})
    fit_search._LAST.clear()


@pytest.mark.parametrize("interrupt_at", [None, 12])
def test_a_model_outside_the_zoo_comes_back_bit_for_bit(interrupt_at):
    t = Trainer()
    for _ in range(3):  # mid-training
        train_step(4, trainer=t)
    t.parts["net"].eval()
    torch.cuda.synchronize()
    before = digest(t)
    step, calls = interrupted_at(functools.partial(train_step, trainer=t), interrupt_at)
    t0 = time.perf_counter()
    result = None
    if interrupt_at is None:
        result = fit_batch_size(step, steps=6, max_trials=5)
        assert result.ok, result.problem
    else:
        with pytest.raises(KeyboardInterrupt):
            fit_batch_size(step, steps=6, max_trials=5)
    torch.cuda.synchronize()
    diff = differences(before, digest(t))
    RESULTS["normal fit" if interrupt_at is None else f"Ctrl-C at step call {interrupt_at}"] = {
        "seconds": time.perf_counter() - t0, "step_calls": calls[0], "differences": diff,
        "recommended": result.recommended if result is not None else None,
        "notes": list(result.notes) if result is not None else [],
    }
    assert diff == []
    if result is not None:
        assert not [n for n in result.notes if n.startswith(("not restored", "not saved"))], result.notes
