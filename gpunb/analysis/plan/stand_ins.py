"""The user's model and optimizer, lent to the plan with stand-in tensors and given back untouched.

For the time of the plan, every parameter and buffer of the modules the step reaches is replaced,
in its module's ``_parameters``/``_buffers``, by a fake tensor of the same shape, dtype and
device (no memory behind it); a parameter's gradient is faked with it. Each optimizer gets the
fake parameters in its groups and fake copies of its state (one-element CPU tensors, like
Adam's ``step``, stay real copies: the update reads their value). The real tensors are never
written: fake tensors run no kernels. :meth:`Lent.give_back` puts the very same objects back, with
SIGINT held, so a Ctrl-C at any point leaves the model as it was. The RNGs (Python's, NumPy's,
torch's) are saved and put back too, and plain values the step's own object changes (a counter)
are put back.

Optimizer groups whose ``foreach`` is left to torch get ``foreach=True`` while lent: on a GPU
torch picks the multi-tensor implementation, whose temporaries are part of the peak; on stand-in
tensors it would pick the per-tensor loop.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.fit.user_state import Reachable, UserState
from gpunb.readings.interrupts import deferred_sigint

_PLAIN = (int, float, bool, str, type(None))


@dataclass
class Lent:
    torch: Any
    fake_of: dict[int, Any] = field(default_factory=dict)  # id(real tensor) -> its stand-in
    slots: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)  # (module dict, name, real)
    optimizers: list[tuple[Any, list[list[Any]], Any, list[Any]]] = field(default_factory=list)
    rng: UserState | None = None
    owner_values: list[tuple[Any, str, Any]] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)  # the fake parameters
    buffers: list[Any] = field(default_factory=list)
    fake_ids: set[int] = field(default_factory=set)
    module_names: dict[int, str] = field(default_factory=dict)
    param_modules: dict[int, str] = field(default_factory=dict)  # id(stand-in parameter) -> its module

    def stand_in(self, mode: Any, t: Any) -> Any:
        fake = self.fake_of.get(id(t))
        if fake is None:
            with mode:
                fake = self.torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
            self.fake_of[id(t)] = fake
        return fake

    def give_back(self) -> None:
        with deferred_sigint():
            for slots, name, real in reversed(self.slots):
                slots[name] = real
            for opt, groups, state, foreach in self.optimizers:
                for group, params, fe in zip(opt.param_groups, groups, foreach, strict=True):
                    group["params"] = params
                    if fe is _MISSING:
                        group.pop("foreach", None)
                    else:
                        group["foreach"] = fe
                opt.state = state
            for owner, name, value in self.owner_values:
                try:
                    setattr(owner, name, value)
                except Exception:  # noqa: BLE001 (a property that refuses: it was the step's to change)
                    pass
            if self.rng is not None:
                for setter, value in self.rng.rng:
                    setter(value)
            self.slots.clear()
            self.optimizers.clear()


_MISSING = object()


def _fake_state_value(lent: Lent, mode: Any, v: Any) -> Any:
    torch = lent.torch
    if isinstance(v, torch.Tensor):
        if v.numel() <= 1 and v.device.type == "cpu":
            return v.detach().clone()
        return lent.stand_in(mode, v)
    return copy.deepcopy(v)


def lend(torch: Any, mode: Any, reach: Reachable, step_fn: Any) -> Lent:
    """Swap stand-ins in (see the module doc); the caller must call ``give_back`` in a ``finally``."""
    lent = Lent(torch)
    with deferred_sigint():
        lent.rng = UserState(torch)
        lent.rng._capture_rng(reach.generators)  # the global RNGs and every generator the step reaches
        owner = getattr(step_fn, "__self__", None)
        if owner is None and not hasattr(step_fn, "__code__"):
            owner = step_fn  # a callable object
        attrs = getattr(owner, "__dict__", None)
        if isinstance(attrs, dict):
            lent.owner_values = [(owner, k, v) for k, v in attrs.items() if isinstance(v, _PLAIN)]
        try:
            _swap_modules(lent, mode, reach.modules)
            _swap_optimizers(lent, mode, reach.optimizers)
        except BaseException:
            lent.give_back()
            raise
    return lent


def _swap_modules(lent: Lent, mode: Any, modules: list[Any]) -> None:
    torch = lent.torch
    for root in modules:
        for name, sub in root.named_modules():
            label = name or type(root).__name__
            if name and name.rsplit(".", 1)[-1].isdigit():  # "blocks.0" says less than its class
                label = f"{name} ({type(sub).__name__})"
            lent.module_names.setdefault(id(sub), label)
            for slots, is_param in ((sub._parameters, True), (sub._buffers, False)):
                for key, real in list(slots.items()):
                    if real is None or id(real) in lent.fake_ids:  # none, or a module met twice
                        continue
                    known = lent.fake_of.get(id(real))
                    if known is not None:  # tied: the same tensor in two places
                        fake = known
                    elif is_param:
                        fake = torch.nn.Parameter(lent.stand_in(mode, real), requires_grad=real.requires_grad)
                        lent.fake_of[id(real)] = fake
                        if real.grad is not None:
                            fake.grad = lent.stand_in(mode, real.grad)
                        lent.params.append(fake)
                        lent.param_modules[id(fake)] = label
                    else:
                        fake = lent.stand_in(mode, real)
                        lent.buffers.append(fake)
                    lent.fake_of[id(real)] = fake
                    lent.fake_ids.add(id(fake))
                    lent.slots.append((slots, key, real))
                    slots[key] = fake


def _swap_optimizers(lent: Lent, mode: Any, optimizers: list[Any]) -> None:
    from gpunb.analysis.plan.recorder import PlanError

    for opt in optimizers:
        groups = [list(g["params"]) for g in opt.param_groups]
        foreach = [g.get("foreach", _MISSING) for g in opt.param_groups]
        state = opt.state
        new_state: defaultdict[Any, dict[str, Any]] = defaultdict(dict)
        for params in groups:
            for p in params:
                if id(p) not in lent.fake_of:
                    raise PlanError(
                        f"{type(opt).__name__} holds a tensor of shape {tuple(p.shape)} that is not a parameter "
                        "of a model gpunb found from the step: pass the model to gpunb.plan(step, batch, model=...)")
                if p in state:
                    new_state[lent.fake_of[id(p)]] = {k: _fake_state_value(lent, mode, v) for k, v in state[p].items()}
        lent.optimizers.append((opt, groups, state, foreach))
        for group, params, fe in zip(opt.param_groups, groups, foreach, strict=True):
            group["params"] = [lent.fake_of[id(p)] for p in params]
            if fe is _MISSING or fe is None:
                group["foreach"] = not group.get("fused")
        opt.state = new_state
