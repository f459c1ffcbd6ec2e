"""The batch-size finders that ``batch_fit_zoo.py`` compares, each run on a zoo model as its users run it.

- ``gpufit``: ``gpunb.fit_batch_size(model.step, steps=N)`` (on a ``--smoke`` twin: the same
  search on its pretend memory, ``gpunb.analysis.fit.search.fit_with_memory``).
- ``lightning_power`` / ``lightning_binsearch``: Lightning's ``Tuner.scale_batch_size``
  (the ``BatchSizeFinder`` callback behind it) with ``mode="power"`` / ``"binsearch"`` and its
  defaults (``init_val=2``, ``steps_per_trial=3``, ``margin=0.05``), except ``max_val``, raised
  from 8192 so that it can reach the models' maxima. The zoo model is wrapped in a
  ``LightningModule`` with manual optimization whose ``training_step`` is the model's step and
  whose ``batch_size`` attribute the tuner changes (source read: Lightning 2.6
  ``src/lightning/pytorch/tuner/batch_size_scaling.py``).
- ``accelerate``: ``accelerate.utils.find_executable_batch_size`` (multiplies the batch by 0.9
  after each out-of-memory error, accelerate >= 1.10; it used to halve) around a function that
  trains 3 steps, started at the power of two above twice the largest batch a quick search
  found, so that it has something to search.

Lightning and accelerate are imported only when their finder runs: a machine without them
reports the finder as unavailable.

Also here: :func:`sustained`, one sustained run (the definition of "fits"), and
:func:`rough_max`, a quick same-process search that brackets the truth for the bisection.
"""

from __future__ import annotations

import gc
import logging
import math
import tempfile
import time
import traceback
from typing import Any

STEPS_PER_TRIAL = 3  # Lightning's default steps_per_trial; accelerate's function trains as many


def _is_oom(exc: BaseException) -> bool:
    from gpunb.analysis.memory.oom_message import find_oom

    return find_oom(exc) is not None


def _settle(model: Any) -> None:
    gc.collect()
    if model.memory is not None:
        model.memory.settle()
    elif model.torch.cuda.is_initialized():
        model.torch.cuda.empty_cache()


def _sync(model: Any) -> None:
    if model.memory is None:
        model.torch.cuda.synchronize()


def sustained(model: Any, batch: int, steps: int) -> dict:
    """Train ``steps`` steps at ``batch``; did it run without an out-of-memory error?"""
    t0 = time.perf_counter()
    done = 0
    try:
        for _ in range(steps):
            model.step(batch)
            done += 1
        _sync(model)
        return {"batch": batch, "ok": True, "steps_done": done, "seconds": time.perf_counter() - t0}
    except Exception as exc:
        if not _is_oom(exc):
            raise
        error = str(exc).split(". ")[0][:160]
        traceback.clear_frames(exc.__traceback__)
        del exc
        _settle(model)
        return {"batch": batch, "ok": False, "steps_done": done, "error": error, "seconds": time.perf_counter() - t0}


def measured(model: Any, batch: int, steps: int) -> dict:
    """One ``%gpufit`` trial of ``batch`` (``steps`` steps from a fresh start), alone in this fresh
    process: every reading the search takes (peaks allocated, before the optimizer step and
    reserved, the memory the last step started with, cache releases, cuDNN's caught OOMs)."""
    from gpunb.analysis.fit.fresh_state import FreshStart
    from gpunb.analysis.fit.trial import CudaMemory, run_trial

    memory = model.memory if model.memory is not None else CudaMemory(model.torch, model.torch.cuda.current_device())
    fresh = FreshStart(model.torch, lambda: None, memory.device)
    t0 = time.perf_counter()
    trial = run_trial(model.step, batch, memory=memory, steps=steps, index=1, purpose="measure", fresh=fresh)
    _settle(model)
    return {"batch": batch, "ok": trial.fits, "seconds": time.perf_counter() - t0, "trial": trial.to_dict()}


def rough_max(model: Any, steps: int) -> dict:
    """Largest batch that runs ``steps`` steps in this process: double from 2, then bisect to 2 %."""
    t0 = time.perf_counter()
    trials = []
    lo, hi, b = 0, None, 2
    while hi is None:
        r = sustained(model, b, steps)
        trials.append((b, r["ok"]))
        _settle(model)
        if r["ok"]:
            lo, b = b, b * 2
        else:
            hi = b
    while hi - lo > max(1, 0.02 * lo):
        mid = (lo + hi) // 2
        r = sustained(model, mid, steps)
        trials.append((mid, r["ok"]))
        _settle(model)
        lo, hi = (mid, hi) if r["ok"] else (lo, mid)
    return {"rough_max": lo, "failed_at": hi, "trials": trials, "seconds": time.perf_counter() - t0}


def gpufit(model: Any, *, steps: int) -> dict:
    t0 = time.perf_counter()
    if model.memory is not None:
        from gpunb.analysis.fit.search import fit_with_memory

        fit = fit_with_memory(model.step, model.memory, capacity=model.memory.budget, steps=steps)
    else:
        import gpunb

        fit = gpunb.fit_batch_size(model.step, steps=steps, progress=False)
    return {"answer": fit.recommended, "trial_count": fit.trial_count, "seconds": time.perf_counter() - t0,
            "trials": [(t.batch, t.fits) for t in fit.trials], "ok": fit.ok, "problem": fit.problem,
            "fit": fit.to_dict()}


def lightning(model: Any, *, mode: str) -> dict:
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.tuner import Tuner
    except ImportError as exc:
        return {"answer": None, "unavailable": f"lightning is not installed ({exc})"}
    torch = model.torch
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trials: list[list[int]] = []  # [batch, steps run] per trial

    class Wrapped(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.zoo = model.module  # a submodule: Lightning checkpoints and restores it, as for real
            self.batch_size = 2
            self.automatic_optimization = False

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(range(2**40), batch_size=self.batch_size)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                trials.append([self.batch_size, 0])
            opt = self.optimizers()
            model.forward_backward(self.batch_size)  # builds its own batch of that size on the device
            opt.step()
            opt.zero_grad(set_to_none=model.set_to_none)
            trials[-1][1] += 1

        def configure_optimizers(self) -> Any:
            return model.optimizer

    with tempfile.TemporaryDirectory(prefix="gpunb-lightning-") as root:
        trainer = pl.Trainer(accelerator="cpu" if model.memory is not None else "gpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=root, max_epochs=1, num_sanity_val_steps=0)
        t0 = time.perf_counter()
        answer = Tuner(trainer).scale_batch_size(Wrapped(), mode=mode, max_val=2**24)
        seconds = time.perf_counter() - t0
    _back_on_device(model)
    _settle(model)
    done = [(b, n >= STEPS_PER_TRIAL) for b, n in trials]
    return {"answer": answer, "trial_count": len(done), "trials": done, "seconds": seconds}


def _back_on_device(model: Any) -> None:
    """Lightning's teardown moves the module and the optimizer state to the CPU; ``trainer.fit``
    moves them back. Do that here, as Lightning does (an optimizer's ``step`` stays where it is)."""
    model.module.to(model.device)
    for state in model.optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, model.torch.Tensor):
                state[key] = value.to(model.device)


def accelerate(model: Any, *, start: int) -> dict:
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError as exc:
        return {"answer": None, "unavailable": f"accelerate is not installed ({exc})"}
    calls: list[int] = []

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int) -> int:
        calls.append(batch_size)
        for _ in range(STEPS_PER_TRIAL):
            model.step(batch_size)
        _sync(model)
        return batch_size

    t0 = time.perf_counter()
    answer = train()
    seconds = time.perf_counter() - t0
    _settle(model)
    return {"answer": answer, "trial_count": len(calls), "seconds": seconds, "start": start,
            "trials": [(b, b == answer) for b in calls]}


def accelerate_start(rough: int) -> int:
    """The power of two above twice ``rough``: room for accelerate's search from above."""
    return 2 ** math.ceil(math.log2(max(2, 2 * rough)))


if __name__ == "__main__":  # benchmarks/*.py are run in turn by scripts/gpu-box-run.sh: nothing to do alone
    print("batch_size_finders.py: the finders of batch_fit_zoo.py (run that one)")
