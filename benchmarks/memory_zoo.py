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
| ``bn_convnet`` | 2 conv+BatchNorm layers, 64 channels at full 128x128, SGD momentum, no ``cudnn.benchmark``; 20 GiB |

``--smoke`` twins (``build(name, smoke=True)``) train a tiny real model on the CPU with a real
AdamW, and charge a simulated CUDA caching allocator (``gpunb.testing.CachingMemory``, under the
model's cap) the blocks their GPU model would take, in its order: weights, the batch, each layer's
saved output, gradients in backward, AdamW's state at a parameter's first step, the update's
temporaries (``gpunb.testing.fake_training``). Sizes are the GPU models' own, estimated from their
shapes (fp32, bf16 where autocast makes it so); ``varlen`` scales its activations by the cycle of
sequence lengths. When a block does not fit they raise ``torch.OutOfMemoryError`` as CUDA would,
so every batch-size finder runs against them, and a fresh process fails where the layout says
it does (the optimizer state carved out of freed activations). Their numbers are the
simulation's, not the H200's.

Run directly, this file lists the zoo (``python benchmarks/memory_zoo.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script: gpunb from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import itertools

from gpunb.testing.fake_training import GpuTwin, SimulatedTraining

GiB = 2**30
MiB = 2**20
VARLEN_CYCLE = (192, 256, 320, 224, 384, 288, 512, 256, 352, 448)  # the longest once every 10 steps


@dataclass(frozen=True)
class Spec:
    name: str
    about: str
    cap_gib: float
    build: Callable[[Any, Any], ZooModel]  # (torch, device) -> model
    smoke: GpuTwin  # what the --smoke twin charges the simulated allocator


class ZooModel:
    """One training setup: a module, its optimizer, and how to make and train on a batch."""

    name = ""
    set_to_none = True  # zero_grad(set_to_none=...) after each optimizer step

    def __init__(self, torch: Any, device: Any, module: Any, lr: float = 1e-4) -> None:
        self.torch = torch
        self.device = device
        self.module = module.to(device)
        self.optimizer = self.make_optimizer(lr)
        self.calls = 0  # forward/backward passes so far (varlen cycles through lengths by it)
        self.memory = None  # the pretend memory of a --smoke twin

    def make_optimizer(self, lr: float) -> Any:
        return self.torch.optim.AdamW(self.module.parameters(), lr=lr)

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


class BnConvNet(ZooModel):
    """The conv net of ``tests/gpu/test_fit_restore_gpu.py``: every activation at full resolution."""

    name = "bn_convnet"

    def __init__(self, torch: Any, device: Any) -> None:
        nn = torch.nn
        torch.backends.cudnn.benchmark = False  # torch's default: cuDNN's heuristics pick the algorithms
        super().__init__(torch, device, nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)), lr=0.05)

    def make_optimizer(self, lr: float) -> Any:
        return self.torch.optim.SGD(self.module.parameters(), lr=lr, momentum=0.9)

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


KiB = 2**10
SEQ = 512


def _linear(a: int, b: int, bias: bool = True) -> tuple[int, ...]:
    return (4 * a * b,) + ((4 * b,) if bias else ())


def _blocks_twin(width: int, depth: int, *, elem: int = 4, checkpointed: bool = False) -> tuple[tuple, tuple]:
    """Parameters and per-sample saved outputs of ``depth`` encoder blocks (sequence 512)."""
    params: list[int] = []
    layers: list[tuple[int, tuple[int, ...]]] = []
    act = SEQ * width * elem  # one (sequence, width) activation of one sample
    for _ in range(depth):
        first = len(params)
        params += [4 * width, 4 * width, *_linear(width, 3 * width), *_linear(width, width), 4 * width, 4 * width,
                   *_linear(width, 4 * width), *_linear(4 * width, width)]
        owned = tuple(range(first, len(params)))
        if checkpointed:  # only the block's input is kept; the rest is recomputed in backward
            layers.append((act, owned))
        else:
            layers += [(act, owned[:2]), (3 * act, owned[2:4]), (act, ()), (act, owned[4:6]), (act, owned[6:8]),
                       (4 * act, owned[8:10]), (4 * act, ()), (act, owned[10:])]
    return tuple(params), tuple(layers)


_T_PARAMS, _T_LAYERS = _blocks_twin(512, 4)
_C_PARAMS, _C_LAYERS = _blocks_twin(384, 4, checkpointed=True)
_B_PARAMS, _B_LAYERS = _blocks_twin(512, 4, elem=2)
_CONV = ((3, 32, 128), (32, 64, 64), (64, 128, 32), (128, 256, 16))  # in, out channels, output side


def _conv_twin() -> tuple[tuple, tuple]:
    params: list[int] = []
    layers: list[tuple[int, tuple[int, ...]]] = []
    for cin, cout, side in _CONV:
        first = len(params)
        params += [4 * cin * cout * 9, 4 * cout, 4 * cout]  # conv weight, BatchNorm weight and bias
        act = 4 * cout * side * side
        layers += [(act, (first,)), (act, (first + 1, first + 2)), (act, ())]  # conv, BatchNorm, ReLU
    params += list(_linear(256, 10))
    layers.append((4 * 10, (len(params) - 2, len(params) - 1)))
    return tuple(params), tuple(layers)


_V_PARAMS, _V_LAYERS = _conv_twin()


def _bn_convnet_twin() -> tuple[tuple, tuple]:
    params: list[int] = []
    layers: list[tuple[int, tuple[int, ...]]] = []
    act = 4 * 64 * 128 * 128  # every layer's output keeps the full 128x128 resolution
    for cin in (3, 64):
        first = len(params)
        params += [4 * cin * 64 * 9, 4 * 64, 4 * 64, 4 * 64]  # conv weight and bias, BatchNorm weight and bias
        layers += [(act, (first, first + 1)), (act, (first + 2, first + 3)), (act, ())]  # conv, BatchNorm, ReLU
    params += list(_linear(64, 10))
    layers.append((4 * 10, (len(params) - 2, len(params) - 1)))
    return tuple(params), tuple(layers)


_N_PARAMS, _N_LAYERS = _bn_convnet_twin()

ZOO: dict[str, Spec] = {s.name: s for s in (
    Spec("mlp", "3-layer MLP 1024-4096-4096-1024, GELU, fp32, AdamW", 4, Mlp,
         GpuTwin(_linear(1024, 4096) + _linear(4096, 4096) + _linear(4096, 1024), inputs=(4 * KiB, 4 * KiB),
                 layers=((16 * KiB, (0, 1)), (16 * KiB, ()), (16 * KiB, (2, 3)), (16 * KiB, ()), (4 * KiB, (4, 5))))),
    Spec("conv_bn", "4 conv+BatchNorm layers on 128x128 images, cudnn.benchmark, AdamW", 6, ConvBn,
         GpuTwin(_V_PARAMS, inputs=(4 * 3 * 128 * 128,), layers=_V_LAYERS, workspace=512 * KiB)),
    Spec("transformer", "4 encoder blocks, width 512, SDPA, sequence 512, fp32", 6, Transformer,
         GpuTwin(_T_PARAMS, inputs=(4 * SEQ * 512,), layers=_T_LAYERS)),
    Spec("varlen", "the transformer with sequence lengths 192-512, the longest once every 10 steps", 6, VarLen,
         GpuTwin(_T_PARAMS, inputs=(4 * SEQ * 512,), layers=_T_LAYERS,
                 lengths=tuple(n / SEQ for n in VARLEN_CYCLE))),
    Spec("bf16_lm", "causal LM, 4 blocks, width 512, vocabulary 8192, bf16 autocast, sequence 512", 6, Bf16Lm,
         GpuTwin((4 * 8192 * 512, *_B_PARAMS, 4 * 8192 * 512), inputs=(8 * (SEQ + 1),),
                 layers=((2 * SEQ * 512, (0,)), *_B_LAYERS, (2 * SEQ * 8192, (len(_B_PARAMS) + 1,)),
                         (4 * SEQ * 8192, ())))),
    Spec("checkpointed", "4 blocks of width 384 under activation checkpointing, sequence 512", 4, Checkpointed,
         GpuTwin(_C_PARAMS, inputs=(4 * SEQ * 384,), layers=_C_LAYERS, workspace=18 * SEQ * 384 * 4)),
    Spec("accumulate", "MLP 1024-8192-1024, 2 micro-batches per step, gradients kept between steps", 3, Accumulate,
         GpuTwin(_linear(1024, 8192) + _linear(8192, 1024), inputs=(4 * KiB,),
                 layers=((32 * KiB, (0, 1)), (32 * KiB, ()), (4 * KiB, (2, 3))), keep_grads=True, micro_batches=2)),
    Spec("bn_convnet", "2 conv+BatchNorm layers of 64 channels at 128x128, SGD momentum, no cudnn.benchmark", 20,
         BnConvNet, GpuTwin(_N_PARAMS, inputs=(4 * 3 * 128 * 128,), layers=_N_LAYERS, workspace=512 * KiB)),
)}


# -- the CPU twins (--smoke) ----------------------------------------------------------------------

class SmokeTwin(SimulatedTraining):
    """A zoo model's CPU twin: a tiny real model charging the simulated allocator its GPU model's blocks."""

    def __init__(self, torch: Any, spec: Spec, memory: Any) -> None:
        super().__init__(spec.smoke, memory, torch=torch)
        self.name = spec.name
        self.device = torch.device("cpu")


def build(name: str, *, smoke: bool = False, device: Any = None) -> ZooModel:
    """The zoo's model ``name`` (``smoke``: its CPU twin, with its simulated allocator as ``.memory``).
    On a GPU the caller sets the process's memory cap first (:func:`cap_memory`)."""
    import torch

    spec = ZOO[name]
    torch.manual_seed(0)
    if smoke:
        from gpunb.testing.fake_caching_allocator import CachingMemory

        return SmokeTwin(torch, spec, CachingMemory(int(spec.cap_gib * GiB), torch=torch))
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
