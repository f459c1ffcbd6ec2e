"""Start every ``%gpufit`` trial as a fresh process starts: no optimizer state, no gradients.

Why: in a fresh process the optimizer state (AdamW: two tensors the size of the weights) is
created by the first ``optimizer.step()``, right after the first step's activations were
freed into the caching allocator's cache, so it is carved out of the large blocks the next
step's activations need again; those blocks cannot be given back while the state sits in
them, and the second step can run out of memory. In the fitting process the state was
created long before, at a tiny batch, in segments of its own, so the same batch passes
there. On two H200s (run 1 of the zoo benchmark) that made two recommendations fail at step 2
in a fresh process while they trained in the fitting one. Copying the state in place after
the first step (``t.data = t.clone()``, round 1) did not reproduce it.

So before each trial the optimizers the step uses are emptied (``optimizer.state`` cleared,
gradients set to None), cuBLAS's workspaces dropped, and the cache is given back: the trial's
first step creates them all exactly where a fresh process would. The user's own state is set aside on the host once,
the first time each optimizer steps during the fit (before that step changes it), and put
back afterwards, with the hyperparameters of its groups (a learning rate a scheduler moved
during the trials returns too). Weights, buffers, gradients, schedulers, scalers, RNGs and
modes are put back by ``user_state.py`` (saved before the first trial).

An optimizer is left alone, its state kept in place (and the fit says so), when setting it
aside would take more than half of the free host memory, or when it was built with
``capturable=True`` (a captured CUDA graph may hold its state's addresses).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HOST_SHARE = 0.5  # set state aside only if it takes at most this share of the free host memory
MAX_OPTIMIZERS = 8  # a step that builds a new optimizer each call has fresh state anyway


@dataclass
class _Saved:
    """One optimizer's state on the host ({parameter: {key: _OnHost or a copy}}) and its groups'
    hyperparameters."""

    optimizer: weakref.ref[Any]
    state: dict[Any, dict[str, Any]]
    groups: list[dict[str, Any]]


@dataclass
class FreshStart:
    """Sets the optimizers' state aside and empties it before each trial; puts it back at the end."""

    torch: Any
    host_available: Callable[[], int | None] = lambda: None  # free host memory, bytes (None: unknown)
    device: Any = None  # the device whose memory is fitted (None: any but the CPU)
    saved: list[_Saved] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # why an optimizer's state stayed in place
    _seen: list[weakref.ref[Any]] = field(default_factory=list)

    def saw(self, opt: Any) -> None:
        """An optimizer is about to step (called from the optimizer pre-step hook): the first time
        in this fit, set its state aside before the step changes it."""
        if any(ref() is opt for ref in self._seen) or len(self._seen) >= MAX_OPTIMIZERS:
            return
        self._seen.append(weakref.ref(opt))
        why = self._why_not(opt)
        if why:
            self.kept.append(why)
            return
        state = {p: {k: self._to_host(v) for k, v in s.items()} for p, s in getattr(opt, "state", {}).items()}
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        self.saved.append(_Saved(weakref.ref(opt), state, groups))

    def _why_not(self, opt: Any) -> str:
        name = type(opt).__name__
        if any(g.get("capturable") for g in getattr(opt, "param_groups", [])):
            return f"{name} has capturable=True (a CUDA graph may hold its state): its state stayed on the GPU"
        if not hasattr(getattr(opt, "state", None), "clear"):
            return f"{name} keeps no state dict gpunb can set aside: its state stayed on the GPU"
        device_bytes = sum(v.nbytes for s in opt.state.values() for v in s.values() if self._on_device(v))
        device_bytes += sum(p.grad.nbytes for p in self._params(opt) if self._on_device(p.grad))
        free = self.host_available()
        if device_bytes and free is not None and device_bytes > HOST_SHARE * free:
            return (f"{name}'s state and gradients ({device_bytes / 2**30:.2f} GiB) would take more than half of the "
                    f"free host memory ({free / 2**30:.2f} GiB): they stayed on the GPU, so the trials did not start "
                    "as a fresh process does and a fresh process may fit less")
        return ""

    def clear(self) -> int:
        """Empty every set-aside optimizer's state and gradients, and cuBLAS's workspaces (the
        caller then empties the cache); the device bytes of state and gradients dropped."""
        self._drop_blas_workspaces()
        dropped = 0
        for s in self._alive():
            opt = s.optimizer()
            if opt is None:  # collected since _alive() looked
                continue
            dropped += sum(v.nbytes for st in opt.state.values() for v in st.values() if self._on_device(v))
            opt.state.clear()
            for p in self._params(opt):
                if p.grad is not None:
                    dropped += p.grad.nbytes if self._on_device(p.grad) else 0
                    p.grad = None
        return dropped

    def restore(self, settle: Callable[[], None]) -> None:
        """Put the users' state back, in segments of its own as it had: the trials' state is
        dropped, the cache emptied (``settle``), then the saved state copied in. Gradients
        stay as the last trial left them (zeros, or None after ``zero_grad(set_to_none=True)``),
        moved to fresh blocks the same way."""
        # The last trial's cuBLAS workspace was allocated inside that trial's first step, in one
        # of its large segments, which it would keep from going back to the device: the user's
        # next step then starts with less room than a fresh process has (on the H200 two zoo
        # models ran out of memory at the recommended batch in the fitting process, not in a
        # fresh one). Dropped here, the user's first matrix product creates it again.
        self._drop_blas_workspaces()
        alive = self._alive()
        grads = []
        for s in alive:
            opt = s.optimizer()
            if opt is None:  # collected since _alive() looked
                continue
            for p in self._params(opt):
                if p.grad is not None:
                    grads.append((p, self._to_host(p.grad)))
                    p.grad = None
            opt.state.clear()
        settle()
        with self.torch.no_grad():
            for s in alive:
                opt = s.optimizer()
                if opt is None:
                    continue
                for p, st in s.state.items():
                    opt.state[p] = {k: self._back(v) for k, v in st.items()}
                for group, saved in zip(opt.param_groups, s.groups):
                    group.update(copy.deepcopy(saved))
            for p, g in grads:
                p.grad = self._back(g)
        self.saved.clear()

    def _drop_blas_workspaces(self) -> None:
        # cuBLAS keeps a workspace per handle and stream, allocated through the caching allocator
        # at the first matrix product. A fresh process allocates it during its first step, where
        # the cache may hold large freed blocks (a convolution's workspace) that it then pins; here
        # it would sit in a segment of its own since the first trial. torch's own memory-leak
        # checks drop it the same way (torch.testing._internal.common_utils).
        clear = getattr(getattr(self.torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
        if clear is not None and self.device is not None and self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
            clear()

    # -- helpers ------------------------------------------------------------------------------------

    def _alive(self) -> list[_Saved]:
        return [s for s in self.saved if s.optimizer() is not None]

    @staticmethod
    def _params(opt: Any) -> list[Any]:
        return [p for g in opt.param_groups for p in g.get("params", [])]

    def _on_device(self, v: Any) -> bool:
        if not isinstance(v, self.torch.Tensor):
            return False
        return bool(v.device.type != "cpu" if self.device is None else v.device.type == self.device.type)

    def _to_host(self, v: Any) -> Any:
        if isinstance(v, self.torch.Tensor):
            return _OnHost(v.device, v.detach().to("cpu", copy=True))
        return copy.deepcopy(v)

    @staticmethod
    def _back(v: Any) -> Any:
        return v.tensor.to(v.device) if isinstance(v, _OnHost) else copy.deepcopy(v)


@dataclass(frozen=True)
class _OnHost:
    device: Any
    tensor: Any
