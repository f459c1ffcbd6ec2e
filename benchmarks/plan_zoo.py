"""The training steps whose peak GPU memory ``%gpuplan`` is calibrated and checked against.

The eight models of ``memory_zoo.py`` (their real GPU definitions, not the ``--smoke`` twins) and
three common shapes written in plain torch, so no torchvision or transformers is needed:

| name | what it is |
|---|---|
| ``resnet50`` | ResNet-50 (bottleneck blocks 3-4-6-3, BatchNorm), 224x224 images, 1000 classes, SGD momentum |
| ``vit_b16`` | ViT-B/16: 16x16 patches of 224x224 images, 12 blocks of width 768, 12 heads, AdamW |
| ``gpt2_small`` | GPT-2 small: 12 causal blocks of width 768, vocabulary 50257, sequence 512, AdamW |

Every model has ``step(batch_size)`` (its batch made on its device, forward, backward, optimizer
step, ``zero_grad``), ``module`` and ``optimizer``; ``BATCHES[name]`` are the three batch sizes that
``plan_calibration_record.py`` measures (for the zoo models, well under and near the largest batch
that trained under its cap in ``results/h200x2_batch_fit_zoo_run1.json``).

    python benchmarks/plan_zoo.py        # lists the models and their batch sizes
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import memory_zoo  # noqa: E402  (benchmarks/ is not a package)

BATCHES: dict[str, tuple[int, int, int]] = {
    "mlp": (4096, 12288, 32768),
    "conv_bn": (64, 192, 512),
    "transformer": (8, 32, 64),
    "varlen": (8, 32, 64),
    "bf16_lm": (8, 24, 48),
    "checkpointed": (16, 64, 160),
    "accumulate": (2048, 8192, 20480),
    "bn_convnet": (64, 256, 512),
    "resnet50": (32, 64, 128),
    "vit_b16": (32, 64, 128),
    "gpt2_small": (8, 32, 64),
}
MODELS = tuple(BATCHES)
# varlen's longest sequence comes at its 7th call: the steady steps must reach it
STEPS = {"varlen": 12}


def _bottleneck(nn: Any, cin: int, width: int, stride: int) -> Any:
    cout = width * 4

    class Bottleneck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.relu(self.body(x) + self.short(x))

    return Bottleneck()


def _resnet50(torch: Any) -> Any:
    nn = torch.nn
    layers: list[Any] = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(_bottleneck(nn, cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


class ResNet50(memory_zoo.ZooModel):
    name = "resnet50"

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device, _resnet50(torch), lr=0.1)

    def make_optimizer(self, lr: float) -> Any:
        return self.torch.optim.SGD(self.module.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)

    def forward_backward(self, batch_size: int) -> None:
        self.calls += 1
        x = self.torch.randn(batch_size, 3, 224, 224, device=self.device)
        y = self.torch.randint(0, 1000, (batch_size,), device=self.device)
        self.torch.nn.functional.cross_entropy(self.module(x), y).backward()


class VitB16(memory_zoo.ZooModel):
    name = "vit_b16"
    width, heads, depth, patch, side, classes = 768, 12, 12, 16, 224, 1000

    def __init__(self, torch: Any, device: Any) -> None:
        nn = torch.nn
        tokens = (self.side // self.patch) ** 2 + 1
        module = nn.ModuleDict({
            "patch": nn.Conv2d(3, self.width, self.patch, stride=self.patch),
            "blocks": memory_zoo._blocks(torch, self.width, self.heads, self.depth, causal=False),
            "norm": nn.LayerNorm(self.width),
            "head": nn.Linear(self.width, self.classes)})
        module.cls = nn.Parameter(torch.zeros(1, 1, self.width))
        module.pos = nn.Parameter(torch.zeros(1, tokens, self.width))
        super().__init__(torch, device, module)

    def forward_backward(self, batch_size: int) -> None:
        torch, m = self.torch, self.module
        self.calls += 1
        x = torch.randn(batch_size, 3, self.side, self.side, device=self.device)
        y = torch.randint(0, self.classes, (batch_size,), device=self.device)
        h = m["patch"](x).flatten(2).transpose(1, 2)
        h = torch.cat([m.cls.expand(batch_size, -1, -1), h], dim=1) + m.pos
        for block in m["blocks"]:
            h = block(h)
        torch.nn.functional.cross_entropy(m["head"](m["norm"](h[:, 0])), y).backward()


class Gpt2Small(memory_zoo.ZooModel):
    name = "gpt2_small"
    vocab, width, heads, depth, seq = 50257, 768, 12, 12, 512

    def __init__(self, torch: Any, device: Any) -> None:
        nn = torch.nn
        module = nn.ModuleDict({
            "embed": nn.Embedding(self.vocab, self.width),
            "pos": nn.Embedding(self.seq, self.width),
            "blocks": memory_zoo._blocks(torch, self.width, self.heads, self.depth, causal=True),
            "norm": nn.LayerNorm(self.width)})
        super().__init__(torch, device, module)

    def forward_backward(self, batch_size: int) -> None:
        torch, m = self.torch, self.module
        self.calls += 1
        tokens = torch.randint(0, self.vocab, (batch_size, self.seq + 1), device=self.device)
        h = m["embed"](tokens[:, :-1]) + m["pos"](torch.arange(self.seq, device=self.device))
        for block in m["blocks"]:
            h = block(h)
        logits = m["norm"](h) @ m["embed"].weight.t()  # the head tied to the embedding, as GPT-2's
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()


EXTRA = {"resnet50": ResNet50, "vit_b16": VitB16, "gpt2_small": Gpt2Small}


def build(name: str, device: Any = None) -> memory_zoo.ZooModel:
    """The model ``name`` on ``device`` (default ``cuda``), seeded, with TF32 on as most training code has it."""
    import torch

    if name not in EXTRA:
        return memory_zoo.build(name, device=device)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return EXTRA[name](torch, torch.device(device or "cuda"))


def main() -> int:
    for name in MODELS:
        print(f"{name:13} batches {BATCHES[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
