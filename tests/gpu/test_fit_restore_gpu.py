"""On the GPU: ``gpunb.fit_batch_size`` leaves two models mid-training exactly as it found them,
bit for bit (issue 22 measured the weights and BatchNorm statistics changed on the H200, and a
scheduler stepped inside the step left 18 epochs ahead).

- a BatchNorm conv net, SGD with momentum, a StepLR stepped inside the step, left in eval();
- an MLP trained with autocast (bfloat16), AdamW, a OneCycleLR stepped inside the step and a
  GradScaler;

each trained a few steps first, then fitted (real OOMs at the large batches); after a normal fit
and after a Ctrl-C in the middle of the trials. Compared: weights, buffers, gradients, optimizer
state and hyperparameters, scheduler and scaler state, the Python, NumPy, torch CPU and CUDA RNG
states and every module's mode.

Run on the GPU machine (about a minute on one H200):
    python -m pytest -m gpu tests/gpu/test_fit_restore_gpu.py -v
Results: $GPUNB_RESULTS/fit_restore_gpu.json.
"""

from __future__ import annotations

import copy
import random
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit.search import fit_batch_size  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402

RESULTS: dict[str, object] = {}


class ConvNet:
    def __init__(self) -> None:
        torch.manual_seed(1)
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.99)

    def step(self, batch: int) -> None:
        self.model.train()
        x = torch.randn(batch, 3, 128, 128, device="cuda")
        loss = torch.nn.functional.cross_entropy(self.model(x), torch.randint(0, 10, (batch,), device="cuda"))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()
        random.random()
        np.random.rand()

    def mid_training(self) -> ConvNet:
        for _ in range(5):
            self.step(16)
        self.model.eval()
        return self


class Mlp:
    def __init__(self) -> None:
        torch.manual_seed(2)
        self.model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                         torch.nn.Linear(8192, 4096)).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=1e-3, total_steps=100_000)
        self.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12, growth_interval=3)

    def step(self, batch: int) -> None:
        x = torch.randn(batch, 4096, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(x).float().square().mean()
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()

    def mid_training(self) -> Mlp:
        for _ in range(7):
            self.step(64)
        return self


def everything(t: object) -> dict[str, object]:
    out: dict[str, object] = {
        "model": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in t.model.named_parameters()},
        "modes": [m.training for m in t.model.modules()],
        "optimizer": copy.deepcopy(t.opt.state_dict()),
        "scheduler": copy.deepcopy(t.sched.state_dict()),
        "python rng": random.getstate(),
        "numpy rng": np.random.get_state(),
        "torch rng": torch.get_rng_state(),
        "cuda rng": torch.cuda.get_rng_state_all(),
    }
    if hasattr(t, "scaler"):
        out["scaler"] = copy.deepcopy(t.scaler.state_dict())
    return out


def differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
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


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    save_json("fit_restore_gpu.json", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "cases": RESULTS})
    fit_search._LAST.clear()


@pytest.mark.parametrize("kind", ["convnet", "mlp"])
@pytest.mark.parametrize("interrupt_at", [None, 30])
def test_the_fit_leaves_a_model_mid_training_bit_for_bit(kind, interrupt_at):
    t = (ConvNet() if kind == "convnet" else Mlp()).mid_training()
    torch.cuda.synchronize()
    before = everything(t)
    real, calls = t.step, [0]

    def step(batch: int) -> None:
        calls[0] += 1
        real(batch)
        if calls[0] == interrupt_at:
            raise KeyboardInterrupt

    t0 = time.perf_counter()
    result = None
    if interrupt_at is None:
        result = fit_batch_size(step, steps=10, max_trials=5)
        assert result.ok, result.message
    else:
        with pytest.raises(KeyboardInterrupt):
            fit_batch_size(step, steps=10, max_trials=5)
    torch.cuda.synchronize()
    diff = differences(before, everything(t))
    RESULTS[f"{kind}, {'Ctrl-C at step call ' + str(interrupt_at) if interrupt_at else 'normal fit'}"] = {
        "seconds": time.perf_counter() - t0, "step_calls": calls[0], "differences": diff,
        "recommended": result.recommended if result is not None else None,
        "notes": list(result.notes) if result is not None else [],
    }
    assert diff == []
