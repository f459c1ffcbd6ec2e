"""Every allocation and free of a step run on stand-in tensors, with its role, line and phase.

Two modes sit on top of torch's ``FakeTensorMode`` while the step runs:

- a ``TorchFunctionMode`` (above autograd) notes the user's line of every torch call and, on
  the autograd node each call creates, the line and the module that made it (in the node's
  ``metadata``: a node cannot be weakly referenced, and a strong reference would keep its
  saved tensors alive);
- a ``TorchDispatchMode`` (below autograd, above the fake tensors) sees every operator: a
  storage it has not seen is an allocation, its end (a weak reference's callback) a free. In the
  backward pass the line is the forward line of the node running
  (``torch._C._current_autograd_node()``): "the backward of `attn`".

A storage's role starts from when it was made (before the step: parameters; in the forward
pass or the step's own code: activations, the batch among them; in the backward pass and the
optimizer step: temporaries) and is corrected when it turns out to be a gradient (autograd's
post-accumulate hook) or optimizer state (what the optimizer holds after its step).

With ``torch.backends.cudnn.benchmark`` on, cuDNN times its algorithms and takes the fastest,
whatever workspace it needs; the recorder notes the largest convolution output
(``benchmark_bytes``), which the replay holds through the backward pass (on the H200, ``conv_bn``
of the zoo at batch 16, 208 and 343 peaked that much above the plan, to within 1 %, while
``bn_convnet``, the same layers without benchmark mode, peaked where planned to 0.1 %:
``h200x2_batch_fit_zoo_run1.json``, ``h200_s4_run1_batch_fit_bn_convnet_gpu.json``).

The dispatch mode also keeps the run harmless and runnable: a real tensor that requires grad
stops the plan (its ``.grad`` would be written), ``.item()`` gives 1 (0 for a truth value) with a
note, and a real tensor read by the step counts as the batch it would be on the GPU.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunb.analysis.memory.alloc_sites import is_library

# roles, as %%gpumem --trace names them (memory.alloc_records.TRACE_ROLES)
PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES = (
    "parameters", "gradients", "optimizer state", "activations", "temporaries")
FORWARD, BACKWARD, OPTIMIZER, STEP, BEFORE = "forward", "backward", "optimizer step", "step", "before the step"
_USER_FRAMES = 6  # the user's frames kept per site (innermost first)
_RUNNER = str(Path(__file__).with_name("dry_run.py"))  # (gpunb's other frames, the modes', are library frames)


class PlanError(Exception):
    """The step cannot be planned; the message is the sentence the user reads."""


@dataclass(eq=False)
class Alloc:
    nbytes: int
    site: int  # index into Recorder.sites
    phase: str
    module: str  # the module running ("" outside any), for the backward: the forward's module
    role: str
    run: int  # which run of the step made it (0: before the first)


@dataclass
class Recorder:
    """The event log of one plan: ``events`` is ``(True, alloc)`` for an allocation, ``(False,
    alloc)`` for a free, in order; ``marks`` the event index where each run of the step began."""

    cell_numbers: Mapping[str, int] = field(default_factory=dict)
    events: list[tuple[bool, Alloc]] = field(default_factory=list)
    sites: list[tuple[dict[str, Any], ...]] = field(default_factory=list)  # user frames, innermost first
    marks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    items_read: int = 0  # .item() and friends the step's own code asked for
    benchmark_bytes: int = 0  # the largest convolution output under cudnn.benchmark (0: none)
    varying: int = 0  # runs made because the step's shapes changed from call to call (0: they did not)
    run: int = 0
    phase: str = BEFORE
    _site_index: dict[tuple[tuple[str, int, str], ...], int] = field(default_factory=dict)
    _live: dict[int, tuple[weakref.ref[Any], Alloc]] = field(default_factory=dict)  # id(storage) ->
    _library: dict[str, bool] = field(default_factory=dict)
    current_site: int = -1
    module_stack: list[str] = field(default_factory=list)
    module_names: dict[int, str] = field(default_factory=dict)  # id(module) -> dotted name
    param_modules: dict[int, str] = field(default_factory=dict)  # id(stand-in parameter) -> its module's name
    device_rewrite: Any = None  # the stand-ins' device, when CUDA names must be read as it

    # -- sites --------------------------------------------------------------------------------------

    def _is_library(self, path: str) -> bool:
        known = self._library.get(path)
        if known is None:
            known = self._library[path] = is_library(path, self.cell_numbers)
        return known

    def site_here(self) -> int:
        """The index of the user's line running now (-1: none of the user's frames)."""
        frames: list[tuple[str, int, str]] = []
        f = sys._getframe(2)
        while f is not None and len(frames) < _USER_FRAMES:
            path = f.f_code.co_filename
            if path == _RUNNER:  # the plan that called the step: the frames above are not the step's
                break
            if not self._is_library(path):
                frames.append((path, f.f_lineno, f.f_code.co_name))
            f = f.f_back  # type: ignore[assignment]
        if not frames:
            return -1
        key = tuple(frames)
        index = self._site_index.get(key)
        if index is None:
            index = self._site_index[key] = len(self.sites)
            self.sites.append(tuple({"filename": p, "line": n, "name": c} for p, n, c in frames))
        return index

    # -- storages -----------------------------------------------------------------------------------

    def _new(self, storage: Any, nbytes: int, site: int, phase: str, module: str, role: str) -> Alloc:
        alloc = Alloc(nbytes, site, phase, module, role, self.run)
        key = id(storage)
        events = self.events
        live = self._live

        def freed(_: Any, key: int = key, alloc: Alloc = alloc) -> None:
            entry = live.get(key)
            if entry is not None and entry[1] is alloc:
                del live[key]
                events.append((False, alloc))

        self._live[key] = (weakref.ref(storage, freed), alloc)
        events.append((True, alloc))
        return alloc

    def known(self, storage: Any) -> Alloc | None:
        entry = self._live.get(id(storage))
        if entry is None or entry[0]() is not storage:
            return None
        return entry[1]

    def adopt(self, tensor: Any, role: str, module: str = "") -> None:
        """A tensor that exists before the step (a parameter, a gradient, optimizer state)."""
        storage = tensor.untyped_storage()
        alloc = self.known(storage)
        if alloc is None:
            self._new(storage, storage.nbytes(), -1, BEFORE, module, role)
        else:
            alloc.role = role

    def mark_role(self, tensor: Any, role: str) -> None:
        alloc = self.known(tensor.untyped_storage())
        if alloc is not None:
            alloc.role = role

    def end_run(self) -> None:
        """What is alive after a run is what the next one starts with (a storage in a reference cycle
        is freed when Python collects it, as on a GPU)."""
        self.phase = STEP


def _flat_tensors(obj: Any, torch: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def make_modes(torch: Any, rec: Recorder) -> tuple[Any, Any]:
    """(the function mode, the dispatch mode) that fill ``rec``; enter the fake mode first."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    scalar_reads = {aten._local_scalar_dense.default}
    convolutions = {aten.convolution.default}

    def cudnn_benchmark() -> bool:
        return bool(torch.backends.cudnn.benchmark)
    current_node: Callable[[], Any] = torch._C._current_autograd_node
    cuda_type = "cuda"

    class SiteMode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            outer = rec.current_site
            rec.current_site = rec.site_here()
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                site, rec.current_site = rec.current_site, outer
            if torch.is_grad_enabled():
                module = rec.module_stack[-1] if rec.module_stack else ""
                for t in _flat_tensors(out, torch):
                    node = t.grad_fn
                    if node is not None and "gpunb_site" not in node.metadata:
                        node.metadata["gpunb_site"] = (site, module)
            return out

    class AllocMode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            node = current_node()
            if node is not None:
                noted = node.metadata.get("gpunb_site")
                if noted is None:  # made outside a torch call the step made (AccumulateGrad, a hook)
                    variable = getattr(node, "variable", None)
                    noted = node.metadata["gpunb_site"] = (
                        rec.site_here(), rec.param_modules.get(id(variable), "") if variable is not None else "")
                site, module = noted
                phase = BACKWARD
            else:
                site, module = rec.current_site, rec.module_stack[-1] if rec.module_stack else ""
                phase = FORWARD if rec.module_stack else rec.phase
            inputs = _flat_tensors((args, kwargs), torch)
            for t in inputs:
                if not isinstance(t, FakeTensor):
                    if t.requires_grad and t.is_leaf:
                        raise PlanError(
                            f"the step uses a tensor of shape {tuple(t.shape)} that requires grad and is not a "
                            "parameter of a model gpunb found from the step (its gradient would be written): "
                            "pass the model to gpunb.plan(step, batch, model=...)")
                    storage = t.untyped_storage()
                    if rec.known(storage) is None and t.numel() > 1:  # on the GPU: the batch copied there
                        rec._new(storage, storage.nbytes(), site, phase, module, ACTIVATIONS)
            if func in scalar_reads:
                if phase != OPTIMIZER:  # the optimizer reads its step count: not the user's
                    rec.items_read += 1
                dtype = inputs[0].dtype if inputs else None
                return False if dtype == torch.bool else 1 if dtype is not None and not dtype.is_floating_point else 1.0
            device = kwargs.get("device")
            if rec.device_rewrite is not None and device is not None and torch.device(device).type == cuda_type:
                kwargs = {**kwargs, "device": rec.device_rewrite}
            out = func(*args, **kwargs)
            if func in convolutions and cudnn_benchmark():
                rec.benchmark_bytes = max(rec.benchmark_bytes, max((t.nbytes for t in _flat_tensors(out, torch)),
                                                                   default=0))
            role = ACTIVATIONS if phase in (FORWARD, STEP, BEFORE) else TEMPORARIES
            for t in _flat_tensors(out, torch):
                storage = t.untyped_storage()
                if rec.known(storage) is None:
                    rec._new(storage, storage.nbytes(), site, phase, module, role)
            return out

    return SiteMode(), AllocMode()  # type: ignore[no-untyped-call]
