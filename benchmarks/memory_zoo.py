"""A zoo of training steps with different memory behaviour, shared by ``batch_fit_zoo.py`` (the
benchmark) and ``tests/gpu/test_batch_fit_zoo_gpu.py`` (the GPU test).

Every model exposes ``step(batch_size)``: it builds its batch on the device, runs forward and
backward (``forward_backward``) and the optimizer step. Each has a per-process memory cap
(``cap_gib``, set with ``torch.cuda.set_per_process_memory_fraction`` by whoever builds it)
small enough on a 140 GB H200 that its largest batch is found in seconds, and the models of a
benchmark run side by side in separate processes.

| name | what sets its memory |
|---|---|
| ``mlp`` | wide fp32 activations of a 3-layer MLP; AdamW state of 25 M parameters |
| ``conv_bn`` | a conv net with BatchNorm, 128x128 images, ``cudnn.benchmark``: cuDNN picks algorithms per shape |
| ``transformer`` | 4 encoder blocks with ``scaled_dot_product_attention``, fp32, sequence 512 |
| ``varlen`` | the same blocks, the sequence length cycling through 10 values: the longest (512) once every 10 steps |
| ``bf16_lm`` | a causal language model under bf16 autocast (flash attention), logits of an 8192-token vocabulary |
| ``checkpointed`` | transformer blocks under activation checkpointing (``torch.utils.checkpoint``, non-reentrant) |
| ``accumulate`` | an MLP, gradients accumulated over 2 micro-batches and kept between steps (``set_to_none=False``) |

``--smoke`` twins (``build(name, smoke=True)``) train a tiny real model on the CPU and charge a
pretend GPU memory (``gpunb.testing.fake_device_memory.BudgetMemory``) the bytes their GPU twin's
memory behaviour would: a fixed part, bytes per sample, the allocator's overhead and, for
``varlen``, a longer batch once every 10 steps. Above the budget they raise
``torch.OutOfMemoryError`` as CUDA would, so every batch-size finder can run against them.

Run directly, this file lists the zoo (``python benchmarks/memory_zoo.py``).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GiB = 2**30
MiB = 2**20
VARLEN_CYCLE = (192, 256, 320, 224, 384, 288, 512, 256, 352, 448)  # the longest once every 10 steps


@dataclass(frozen=True)
class Smoke:
    """The CPU twin's charges to the pretend memory (bytes)."""

    fixed: int
    per_sample: int
    overhead: float = 0.0  # reserved above allocated
    long_factor: float = 1.0  # a longer batch once every 10 steps (varlen)


@dataclass(frozen=True)
class Spec:
    name: str
    about: str
    cap_gib: float
    build: Callable[[Any, Any], ZooModel]  # (torch, device) -> model
    smoke: Smoke


SMOKE_BUDGET = 256 * MiB


class ZooModel:
    """One training setup: a module, its optimizer, and how to make and train on a batch."""

    name = ""
    set_to_none = True  # zero_grad(set_to_none=...) after each optimizer step

    def __init__(self, torch: Any, device: Any, module: Any, lr: float = 1e-4) -> None:
        self.torch = torch
        self.device = device
        self.module = module.to(device)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr)
        self.calls = 0  # forward/backward passes so far (varlen cycles through lengths by it)
        self.memory = None  # the pretend memory of a --smoke twin

    def forward_backward(self, batch_size: int) -> None:
        raise NotImplementedError

    def step(self, batch_size: int) -> None:
        self.forward_backward(batch_size)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)


# -- the GPU models -----------------------------------------------------------------------------

def _mlp(torch: Any, widths: tuple[int, ...]) -> Any:
    layers: list[Any] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


class Mlp(ZooModel):
    name = "mlp"

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device, _mlp(torch, (1024, 4096, 4096, 1024)))

    def forward_backward(self, batch_size: int) -> None:
        self.calls += 1
        x = self.torch.randn(batch_size, 1024, device=self.device)
        target = self.torch.randn(batch_size, 1024, device=self.device)
        self.torch.nn.functional.mse_loss(self.module(x), target).backward()


class ConvBn(ZooModel):
    name = "conv_bn"

    def __init__(self, torch: Any, device: Any) -> None:
        nn = torch.nn
        torch.backends.cudnn.benchmark = True  # per shape, cuDNN times its algorithms (and workspaces)
        chans = (3, 32, 64, 128, 256)
        layers: list[Any] = []
        for i, (a, b) in enumerate(itertools.pairwise(chans)):
            layers += [nn.Conv2d(a, b, 3, stride=1 if i == 0 else 2, padding=1, bias=False), nn.BatchNorm2d(b),
                       nn.ReLU()]
        super().__init__(torch, device, nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                                      nn.Linear(256, 10)), lr=1e-3)

    def forward_backward(self, batch_size: int) -> None:
        self.calls += 1
        x = self.torch.randn(batch_size, 3, 128, 128, device=self.device)
        y = self.torch.randint(0, 10, (batch_size,), device=self.device)
        self.torch.nn.functional.cross_entropy(self.module(x), y).backward()


def _blocks(torch: Any, width: int, heads: int, depth: int, causal: bool) -> Any:
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, width))
            return x + self.mlp(self.ln2(x))

    return nn.ModuleList(Block() for _ in range(depth))


class Transformer(ZooModel):
    name = "transformer"
    width, heads, depth, checkpointed = 512, 8, 4, False

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device, _blocks(torch, self.width, self.heads, self.depth, causal=False))

    def seq_len(self) -> int:
        return 512

    def forward_backward(self, batch_size: int) -> None:
        seq = self.seq_len()
        self.calls += 1
        h = self.torch.randn(batch_size, seq, self.width, device=self.device)
        for block in self.module:
            if self.checkpointed:
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        h.square().mean().backward()


class VarLen(Transformer):
    name = "varlen"

    def seq_len(self) -> int:
        return VARLEN_CYCLE[self.calls % len(VARLEN_CYCLE)]


class Checkpointed(Transformer):
    name = "checkpointed"
    width, heads, depth, checkpointed = 384, 6, 4, True


class Bf16Lm(ZooModel):
    name = "bf16_lm"
    vocab, width, seq = 8192, 512, 512

    def __init__(self, torch: Any, device: Any) -> None:
        nn = torch.nn
        module = nn.ModuleDict({"embed": nn.Embedding(self.vocab, self.width),
                                "blocks": _blocks(torch, self.width, 8, 4, causal=True),
                                "head": nn.Linear(self.width, self.vocab, bias=False)})
        super().__init__(torch, device, module)

    def forward_backward(self, batch_size: int) -> None:
        torch = self.torch
        self.calls += 1
        tokens = torch.randint(0, self.vocab, (batch_size, self.seq + 1), device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            h = self.module["embed"](tokens[:, :-1])
            for block in self.module["blocks"]:
                h = block(h)
            logits = self.module["head"](h)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()


class Accumulate(ZooModel):
    name = "accumulate"
    micro_batches = 2
    set_to_none = False  # gradients stay allocated between steps (zeroed in place)

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device, _mlp(torch, (1024, 8192, 1024)))

    def forward_backward(self, batch_size: int) -> None:
        for _ in range(self.micro_batches):  # batch_size is the micro-batch: what sets the memory
            self.calls += 1
            x = self.torch.randn(batch_size, 1024, device=self.device)
            (self.module(x).square().mean() / self.micro_batches).backward()


ZOO: dict[str, Spec] = {s.name: s for s in (
    Spec("mlp", "3-layer MLP 1024-4096-4096-1024, GELU, fp32, AdamW", 4, Mlp,
         Smoke(fixed=24 * MiB, per_sample=640 * 1024, overhead=0.03)),
    Spec("conv_bn", "4 conv+BatchNorm layers on 128x128 images, cudnn.benchmark, AdamW", 6, ConvBn,
         Smoke(fixed=8 * MiB, per_sample=1536 * 1024, overhead=0.10)),
    Spec("transformer", "4 encoder blocks, width 512, SDPA, sequence 512, fp32", 6, Transformer,
         Smoke(fixed=40 * MiB, per_sample=1024 * 1024, overhead=0.05)),
    Spec("varlen", "the transformer with sequence lengths 192-512, the longest once every 10 steps", 6, VarLen,
         Smoke(fixed=40 * MiB, per_sample=640 * 1024, overhead=0.05, long_factor=1.6)),
    Spec("bf16_lm", "causal LM, 4 blocks, width 512, vocabulary 8192, bf16 autocast, sequence 512", 6, Bf16Lm,
         Smoke(fixed=48 * MiB, per_sample=896 * 1024, overhead=0.04)),
    Spec("checkpointed", "4 blocks of width 384 under activation checkpointing, sequence 512", 4, Checkpointed,
         Smoke(fixed=20 * MiB, per_sample=384 * 1024, overhead=0.06)),
    Spec("accumulate", "MLP 1024-8192-1024, 2 micro-batches per step, gradients kept between steps", 3, Accumulate,
         Smoke(fixed=64 * MiB, per_sample=512 * 1024, overhead=0.02)),
)}


# -- the CPU twins (--smoke) ----------------------------------------------------------------------

class SmokeTwin(ZooModel):
    """A tiny real model trained on the CPU; it charges the pretend memory its GPU twin's bytes."""

    def __init__(self, torch: Any, spec: Spec, memory: Any) -> None:
        super().__init__(torch, torch.device("cpu"), _mlp(torch, (16, 32, 4)), lr=1e-3)
        self.name = spec.name
        self.spec = spec.smoke
        self.memory = memory
        self.set_to_none = spec.name != "accumulate"
        memory.keep(self.spec.fixed)

    def forward_backward(self, batch_size: int) -> None:
        long = self.spec.long_factor if VARLEN_CYCLE[self.calls % len(VARLEN_CYCLE)] == max(VARLEN_CYCLE) else 1.0
        self.calls += 1
        x = self.torch.randn(min(batch_size, 256), 16)
        self.module(x).square().mean().backward()
        self.memory.use(int(self.spec.per_sample * batch_size * long))  # raises the pretend OOM above the budget


def build(name: str, *, smoke: bool = False, device: Any = None) -> ZooModel:
    """The zoo's model ``name`` (``smoke``: its CPU twin, with its pretend memory as ``.memory``).
    On a GPU the caller sets the process's memory cap first (:func:`cap_memory`)."""
    import torch

    spec = ZOO[name]
    torch.manual_seed(0)
    if smoke:
        from gpunb.testing.fake_device_memory import BudgetMemory

        memory = BudgetMemory(SMOKE_BUDGET, fragmentation=spec.smoke.overhead, torch=torch)
        return SmokeTwin(torch, spec, memory)
    torch.backends.cuda.matmul.allow_tf32 = True  # as most training code does: faster, same memory
    torch.backends.cudnn.allow_tf32 = True
    return spec.build(torch, torch.device(device or "cuda"))


def cap_memory(name: str, device: Any = None) -> int:
    """Cap this process's CUDA caching allocator at the model's ``cap_gib``; returns the cap in bytes."""
    import torch

    dev = torch.device(device or "cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()  # torch wants an index here
    total = torch.cuda.mem_get_info(index)[1]
    cap = int(ZOO[name].cap_gib * GiB)
    torch.cuda.set_per_process_memory_fraction(cap / total, index)
    return cap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="List the memory zoo (used by batch_fit_zoo.py).")
    ap.add_argument("--out", help="ignored: this module is a library of batch_fit_zoo.py")
    ap.parse_args(argv)
    for s in ZOO.values():
        print(f"{s.name:13} cap {s.cap_gib:>4} GiB  {s.about}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
