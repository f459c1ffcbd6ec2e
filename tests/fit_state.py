"""What the ``%gpufit`` restore tests share (``tests/test_fit_restore.py`` on the CPU,
``tests/gpu/test_fit_restore_gpu.py`` on the H200): two training setups mid-training, a copy of
everything a user could look at afterwards, the differences between two such copies (bit for
bit), and a step that counts its calls and can be interrupted at one.

On the CPU the models are small and charge the simulated budget of
``gpunb.testing.fake_device_memory`` what their GPU twin would use (``memory``); on the GPU they
are the sizes the H200 test runs (``gpu=True``), real out-of-memory errors at large batches.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MiB = 2**20


class ConvNet:
    """A BatchNorm conv net with SGD (momentum) and a StepLR stepped inside the step; the user
    left it in eval() mode, the step switches it to train() and draws from Python's and NumPy's
    RNGs too."""

    def __init__(self, memory: Any = None, *, gpu: bool = False) -> None:
        torch.manual_seed(1)
        nn = torch.nn
        self.memory, self.gpu = memory, gpu
        self.device = "cuda" if gpu else "cpu"
        width, layers, self.side, classes = (64, 2, 128, 10) if gpu else (8, 1, 8, 4)
        body: list[Any] = []
        for i in range(layers):
            body += [nn.Conv2d(3 if i == 0 else width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        self.model = nn.Sequential(*body, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
        self.model.to(self.device)
        self.classes = classes
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05 if gpu else 0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.99 if gpu else 0.9)
        if memory is not None:
            memory.keep(64 * MiB)

    def step(self, batch: int) -> None:
        if self.memory is not None:
            self.memory.use(3 * MiB * batch)
        n = batch if self.gpu else min(batch, 64)  # the CPU twin computes at most 64 samples
        self.model.train()
        x = torch.randn(n, 3, self.side, self.side, device=self.device)
        y = torch.randint(0, self.classes, (n,), device=self.device)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()
        random.random()
        np.random.rand()

    def mid_training(self) -> ConvNet:
        for _ in range(5 if self.gpu else 3):
            self.step(16 if self.gpu else 4)
        self.model.eval()
        return self


class Mlp:
    """An MLP with AdamW, a OneCycleLR stepped inside the step and a GradScaler (under bf16
    autocast on the GPU)."""

    def __init__(self, memory: Any = None, *, gpu: bool = False) -> None:
        torch.manual_seed(2)
        nn = torch.nn
        self.memory, self.gpu = memory, gpu
        self.device = "cuda" if gpu else "cpu"
        self.width, hidden = (4096, 8192) if gpu else (16, 32)
        self.model = nn.Sequential(nn.Linear(self.width, hidden), nn.GELU() if gpu else nn.ReLU(), nn.Dropout(0.1),
                                   nn.Linear(hidden, self.width if gpu else 4)).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4 if gpu else 1e-3, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=1e-3 if gpu else 0.01,
                                                         total_steps=100_000 if gpu else 10_000)
        self.scaler = torch.amp.GradScaler(self.device, init_scale=2.0**12 if gpu else 1024.0,
                                           growth_interval=3 if gpu else 2)
        if memory is not None:
            memory.keep(32 * MiB)

    def step(self, batch: int) -> None:
        if self.memory is not None:
            self.memory.use(2 * MiB * batch)
        n = batch if self.gpu else min(batch, 64)
        x = torch.randn(n, self.width, device=self.device)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.gpu):
            loss = self.model(x).float().square().mean()
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()

    def mid_training(self) -> Mlp:
        for _ in range(7 if self.gpu else 5):
            self.step(64 if self.gpu else 4)
        return self


MODELS = {"convnet": ConvNet, "mlp": Mlp}


def everything(t: Any) -> dict[str, object]:
    """What the user could look at afterwards, copied: weights and buffers, gradients, modes,
    optimizer, scheduler and scaler state, and every RNG (CUDA's on the GPU)."""
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
    if getattr(t, "gpu", False):
        out["cuda rng"] = torch.cuda.get_rng_state_all()
    if hasattr(t, "scaler"):
        out["scaler"] = copy.deepcopy(t.scaler.state_dict())
    return out


def differences(a: object, b: object, path: str = "") -> list[str]:
    """Where two copies differ, bit for bit (floating-point tensors compared as bytes: -0.0 is
    not 0.0, and NaNs compare)."""
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


def interrupted_at(step: Callable[[int], None], at_call: int | None) -> tuple[Callable[[int], None], list[int]]:
    """``step`` that counts its calls (the list's one item) and raises KeyboardInterrupt right
    after call ``at_call`` changed things (None: never)."""
    calls = [0]

    def counted(batch: int) -> None:
        calls[0] += 1
        step(batch)
        if calls[0] == at_call:
            raise KeyboardInterrupt

    return counted, calls
