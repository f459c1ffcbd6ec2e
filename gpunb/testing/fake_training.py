"""A training step that runs for real on the CPU and charges a simulated GPU allocator what its
GPU twin would allocate, in the order the twin would allocate it.

A tiny real model (one small parameter for each of the twin's parameters) is trained by a
real ``torch.optim.AdamW``, so torch's optimizer hooks fire, gradients and optimizer state
appear and disappear as in real training, and whatever a caller does to them (set a
gradient to None, clear the optimizer's state, put it back) frees or keeps the twin's
blocks in :class:`~gpunb.testing.fake_caching_allocator.CachingMemory`: each real gradient
and state tensor is tied to the block its GPU twin would have.

One step, in the twin's order: the batch's tensors; each layer's output, kept for backward
(and a transient workspace per layer, as cuDNN takes); backward from the last layer: the
gradient of each layer's input, the gradients of its parameters the first time they appear,
its saved output freed; then ``optimizer.step()``: the state of a parameter that has none
(AdamW: two tensors its size), then one temporary per parameter (the foreach update's
square roots), freed; then ``zero_grad``. This is the order that makes a fresh process
differ from a long-lived one: there the optimizer state is carved out of the blocks the
first step's activations just freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpunb.testing.fake_caching_allocator import CachingMemory


@dataclass(frozen=True)
class GpuTwin:
    """What the GPU model allocates, in bytes."""

    params: tuple[int, ...]  # each parameter, in the order the model creates them
    inputs: tuple[int, ...]  # per sample: the batch's tensors, made at the start of the step
    layers: tuple[tuple[int, tuple[int, ...]], ...]  # per sample: a layer's saved output; the parameters it owns
    keep_grads: bool = False  # zero_grad(set_to_none=False): gradients stay between steps
    micro_batches: int = 1  # backward passes per optimizer step (gradient accumulation)
    lengths: tuple[float, ...] = (1.0,)  # per call, cycling: the activations' scale (variable sequence lengths)
    workspace: int = 0  # per sample: a transient at each layer's forward (a convolution's workspace)

    @property
    def param_bytes(self) -> int:
        return sum(self.params)


class SimulatedTraining:
    """``step(batch)``: forward, backward, ``optimizer.step()``, ``zero_grad`` of a tiny real
    model, charging ``memory`` its GPU twin's blocks. Raises ``torch.OutOfMemoryError`` as CUDA
    would when the twin's blocks do not fit."""

    def __init__(self, twin: GpuTwin, memory: CachingMemory, *, torch: Any = None, lr: float = 1e-3) -> None:
        if torch is None:
            import torch
        self.torch, self.twin, self.memory = torch, twin, memory
        torch.manual_seed(0)
        self.module = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4) * 0.1) for _ in twin.params)
        self.nbytes = {p: n for p, n in zip(self.module, twin.params)}
        for p, n in self.nbytes.items():  # the weights, made when the model moves to the GPU
            memory.tie(p, memory.alloc(n))
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr)
        self.optimizer.register_step_pre_hook(self._charge_step)
        self.optimizer.register_step_post_hook(self._tie_new_state)
        self._new_state: dict[Any, list[Any]] = {}
        self.calls = 0
        self.set_to_none = not twin.keep_grads

    # -- the step ----------------------------------------------------------------------------------

    def step(self, batch_size: int) -> None:
        self.forward_backward(batch_size)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)

    def forward_backward(self, batch_size: int) -> None:
        for _ in range(self.twin.micro_batches):
            self._one_pass(batch_size)

    def _one_pass(self, batch: int) -> None:
        twin, mem, torch = self.twin, self.memory, self.torch
        scale = twin.lengths[self.calls % len(twin.lengths)]
        self.calls += 1
        live: list[Any] = []  # this pass's blocks not yet freed or tied (freed if it fails)

        def alloc(nbytes: int) -> Any:
            live.append(mem.alloc(nbytes))
            return live[-1]

        def free(block: Any) -> None:
            if block is not None:
                live.remove(block)
                mem.free(block)

        def per(nbytes: int) -> int:
            return int(nbytes * batch * scale)

        try:
            inputs = [alloc(per(n)) for n in twin.inputs]
            saved = []
            for out, _ in twin.layers:
                saved.append(alloc(per(out)))
                if twin.workspace:
                    free(alloc(per(twin.workspace)))
            missing = {i for i, p in enumerate(self.module) if not mem.tied(p.grad)}
            grads: dict[int, Any] = {}
            grad = alloc(per(twin.layers[-1][0])) if twin.layers else None  # d loss / d last output
            for k in reversed(range(len(twin.layers))):
                below = twin.layers[k - 1][0] if k else 0  # the first layer's input needs no gradient
                new = alloc(per(below)) if below else None
                for i in twin.layers[k][1]:
                    if i in missing and i not in grads:
                        grads[i] = alloc(twin.params[i])
                free(grad)
                grad = new
                free(saved[k])
            free(grad)
            for b in inputs:
                free(b)
            x = torch.randn(min(batch, 64), 4)
            loss = sum((x @ p).square().mean() for p in self.module) / twin.micro_batches
            loss.backward()
            for i, block in grads.items():
                mem.tie(self.module[i].grad, block)
                live.remove(block)
        finally:
            for block in live:
                mem.free(block)

    # -- the optimizer's part ------------------------------------------------------------------------

    def _charge_step(self, opt: Any, *_: Any) -> None:
        mem = self.memory
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        self._new_state = {}
        temporaries: list[Any] = []
        try:
            for p in params:  # AdamW's first step of a parameter: exp_avg, exp_avg_sq, in parameter order
                state = opt.state.get(p) or {}
                if not (mem.tied(state.get("exp_avg")) and mem.tied(state.get("exp_avg_sq"))):
                    self._new_state[p] = []
                    self._new_state[p] += [mem.alloc(self.nbytes[p]), mem.alloc(self.nbytes[p])]
            for p in params:
                temporaries.append(mem.alloc(self.nbytes[p]))
        except BaseException:
            for block in [b for blocks in self._new_state.values() for b in blocks]:
                mem.free(block)
            self._new_state = {}
            raise
        finally:
            for t in temporaries:
                mem.free(t)

    def _tie_new_state(self, opt: Any, *_: Any) -> None:
        for p, (avg, avg_sq) in self._new_state.items():
            state = opt.state[p]
            self.memory.tie(state["exp_avg"], avg)
            self.memory.tie(state["exp_avg_sq"], avg_sq)
        self._new_state = {}
