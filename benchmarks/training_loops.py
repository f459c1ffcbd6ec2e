"""The training loops that gpunb's overhead benchmarks time, defined once.

``profile_overhead.py`` (what ``%%gpuprofile`` costs) and ``monitor_overhead.py`` (what a live
``%gpumonitor`` costs) both put gpunb beside these loops; the two sets of figures can be read
side by side only when both time the same steps, so both build them here.

- ``launch-bound``: 8 x ``Linear(1024, 1024)`` + ReLU, bias, fp32, batch 64, AdamW (~2.3-2.6 ms/step
  on the H200). It stresses the host: each kernel takes less time than its launch, so every host
  cost gpunb adds shows in full.
- ``compute-bound``: 4 x ``Linear(8192, 8192)`` + ReLU, no bias, bf16 weights and input, batch 8192,
  AdamW (~20 ms/step). It stresses the GPU: matmuls keep it busy and host costs hide behind its queue.

On the CPU (smoke runs, where no GPU is present or ``--device cpu`` is asked) the same
structure is built at tiny sizes in fp32: it exercises the benchmark's code and measures
nothing about GPUs.

A step is: forward, loss = mean of the squared output in fp32, ``zero_grad(set_to_none=True)``,
backward, optimizer step. The input is made once on the device before any timing, so a step
has no data work. torch is imported only when a loop is built: a benchmark's parent process
that only launches children never pays for it.

Run directly, this file lists the loops (``scripts/gpu-box-run.sh`` runs every
``benchmarks/*.py`` with ``--out``; there is nothing to measure here alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LoopShape:
    """The sizes of one loop on one kind of device."""

    width: int
    depth: int
    batch: int
    dtype: str  # a torch dtype's name: "float32", "bfloat16"
    bias: bool


# (loop name, "cuda" or "cpu") -> shape. The CUDA shapes are the ones whose figures benchmarks/README.md reports.
SHAPES: dict[tuple[str, str], LoopShape] = {
    ("launch-bound", "cuda"): LoopShape(width=1024, depth=8, batch=64, dtype="float32", bias=True),
    ("launch-bound", "cpu"): LoopShape(width=32, depth=8, batch=16, dtype="float32", bias=True),
    ("compute-bound", "cuda"): LoopShape(width=8192, depth=4, batch=8192, dtype="bfloat16", bias=False),
    ("compute-bound", "cpu"): LoopShape(width=256, depth=4, batch=256, dtype="float32", bias=False),
}
LOOPS: tuple[str, ...] = ("launch-bound", "compute-bound")


@dataclass
class TrainingLoop:
    """A built loop: ``run(steps)`` trains that many steps and returns without synchronizing."""

    name: str
    device: str
    shape: LoopShape
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    run: Callable[[int], None]

    def sync(self) -> None:
        """Wait until the GPU finished what the loop queued (nothing to wait for on the CPU)."""
        synchronize(self.device)


def build_loop(name: str, device: str, seed: int = 0) -> TrainingLoop:
    """The loop ``name`` on ``device`` ("cuda" or "cpu"), seeded, its input already on the device."""
    if name not in LOOPS:
        raise ValueError(f"unknown training loop {name!r}; choose one of {', '.join(LOOPS)}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
    import torch

    shape = SHAPES[(name, device)]
    dtype = getattr(torch, shape.dtype)
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(shape.depth):
        layers += [torch.nn.Linear(shape.width, shape.width, bias=shape.bias), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(shape.batch, shape.width, device=device, dtype=dtype)

    def run(steps: int) -> None:
        for _ in range(steps):
            loss = model(x).float().pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return TrainingLoop(name, device, shape, model, optimizer, run)


def synchronize(device: str) -> None:
    """``torch.cuda.synchronize()`` on CUDA; nothing on the CPU, whose work is done when a call returns."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def describe() -> str:
    rows = [f"{name:<14} {dev:<5} {s.depth} x {s.width} wide, batch {s.batch}, {s.dtype}, bias {s.bias}"
            for (name, dev), s in SHAPES.items()]
    return "\n".join(["training loops of the overhead benchmarks (benchmarks/training_loops.py):", *rows])


if __name__ == "__main__":  # benchmarks/*.py are run in turn by scripts/gpu-box-run.sh: nothing to measure alone
    print(describe())
