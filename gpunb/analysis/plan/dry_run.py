"""Run the user's step on stand-in tensors, twice, and record what it allocates.

The first run is the step as a fresh process runs it (the optimizer makes its state there); the
second is every later step (the state exists). When the forward pass allocates differently in
the two (the step varies its shapes from call to call: sequence lengths, buckets), it runs again
until the first run's allocations come round again, at most :data:`MAX_RUNS` times: the peak is
the largest of them. Nothing trains: the parameters are fake tensors
(:mod:`stand_ins`), and torch runs no kernel on a fake tensor. ``torch.compile`` is set to run
eagerly while planning (``torch.compiler.set_stance("force_eager")``), so a compiled step is
planned as its eager twin. What cannot run on fake tensors ends the plan with one sentence
(:class:`PlanError`): a shape that depends on the data, an operator with no shape function (a
custom CUDA extension), CUDA asked for by name on a torch without CUDA, any error of the step.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import logging
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpunb.analysis.fit.user_state import Reachable
from gpunb.analysis.plan.recorder import (
    FORWARD,
    GRADIENTS,
    OPTIMIZER,
    OPTIMIZER_STATE,
    PARAMETERS,
    STEP,
    PlanError,
    Recorder,
    make_modes,
)
from gpunb.analysis.plan.stand_ins import Lent, lend

RUNS = 2  # the first step (state made) and a steady one
MAX_RUNS = 16  # when the forward's allocations change from call to call: until they come round again


def _where(exc: BaseException, rec: Recorder) -> str:
    """The user's line the exception passed through, innermost ("" when none)."""
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = frame.f_code.co_filename
        if not rec._is_library(path):
            code = linecache.getline(path, line).strip()
            where = f"line {line}"
            number = rec.cell_numbers.get(path)
            if number is not None:
                where = f"In [{number}] line {line}"
            return f" at {where}" + (f" (`{code[:80]}`)" if code else "")
    return ""


def explain(exc: BaseException, rec: Recorder) -> str:
    """The sentence for an exception the step raised on stand-ins."""
    if isinstance(exc, PlanError):
        return str(exc)
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    where = _where(exc, rec)
    if name in ("DynamicOutputShapeException", "DataDependentOutputException") or "data-dependent" in text:
        return (f"the step has a shape that depends on the values of a tensor{where} ({text}): a plan runs on "
                "tensors without values; plan a step whose shapes the batch size decides, or measure it with "
                "%gpufit on a GPU")
    no_shape = "no fake impl" in text or ("meta" in text.lower() and "kernel" in text)
    if name == "UnsupportedOperatorException" or no_shape:
        return (f"the step calls an operator with no shape function{where} ({text}), often a custom CUDA "
                "extension: its memory cannot be planned without a GPU; register a fake implementation "
                "(torch.library.register_fake) or measure it with %gpufit")
    if "not compiled with CUDA" in text or "not linked with support for cuda" in text:
        return (f"the step asks for CUDA by name{where}, which this torch (built without CUDA) cannot do even on "
                "stand-in tensors: choose the device with `'cuda' if torch.cuda.is_available() else 'cpu'` and "
                "plan again")
    return f"the step raised {name}{where} while planning on stand-in tensors: {text}"


@contextlib.contextmanager
def _hooks(torch: Any, rec: Recorder, lent: Lent, optimizers: list[Any]) -> Iterator[None]:
    """Global module and optimizer hooks that tell the recorder where the step is, for the plan only."""
    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    handles: list[Any] = []
    names = lent.module_names
    planned = {id(o) for o in optimizers}

    def pre(module: Any, args: Any) -> None:
        rec.module_stack.append(names.get(id(module), type(module).__name__))

    def post(module: Any, args: Any, out: Any) -> None:
        if rec.module_stack:
            rec.module_stack.pop()

    def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
        if id(opt) in planned:
            rec.phase = OPTIMIZER

    def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
        if id(opt) in planned:
            rec.phase = STEP
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        rec.mark_role(v, OPTIMIZER_STATE)

    def grad_hook(p: Any) -> None:
        if p.grad is not None:
            rec.mark_role(p.grad, GRADIENTS)

    try:
        handles.append(nn_module.register_module_forward_pre_hook(pre))
        handles.append(nn_module.register_module_forward_hook(post, always_call=True))
        handles.append(register_optimizer_step_pre_hook(opt_pre))
        handles.append(register_optimizer_step_post_hook(opt_post))
        handles += [p.register_post_accumulate_grad_hook(grad_hook) for p in lent.params if p.requires_grad]
        yield
    finally:
        for h in reversed(handles):
            h.remove()


class _Quiet:
    """What the step prints while it is planned (a loss of 1.0, the same line twice) is not shown,
    nor the traceback torch's fake tensors log for an operator that failed (the plan says it in a
    sentence)."""

    _LOGGER = "torch._subclasses.fake_tensor"

    def __enter__(self) -> None:
        self._out = contextlib.redirect_stdout(io.StringIO())
        self._err = contextlib.redirect_stderr(io.StringIO())
        self._out.__enter__()
        self._err.__enter__()
        log = logging.getLogger(self._LOGGER)
        self._level, self._disabled = log.level, log.disabled
        log.disabled = True

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger(self._LOGGER).disabled = self._disabled
        self._err.__exit__(*exc)
        self._out.__exit__(*exc)


def _eager(torch: Any) -> contextlib.AbstractContextManager[Any]:
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if stance is None:
        return contextlib.nullcontext()
    try:
        return stance("force_eager")  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 (an older torch: run as it is)
        return contextlib.nullcontext()


def dry_run(torch: Any, step: Callable[[int], Any], batch_size: int, reach: Reachable, *,
            cell_numbers: Mapping[str, int] | None = None, runs: int = RUNS) -> Recorder:
    """The recorded runs of ``step(batch_size)``; raises :class:`PlanError` with the sentence."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = Recorder(dict(cell_numbers or {}))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    lent = lend(torch, fake_mode, reach, step)
    try:
        rec.module_names, rec.param_modules = lent.module_names, lent.param_modules
        if any(t.device.type == "cpu" for t in lent.params):
            rec.device_rewrite = torch.device("cpu")
        for p in lent.params:
            rec.adopt(p, PARAMETERS)
            if p.grad is not None:
                rec.adopt(p.grad, GRADIENTS)
        for b in lent.buffers:
            rec.adopt(b, PARAMETERS)
        for opt in reach.optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and v.numel() > 1:
                        rec.adopt(v, OPTIMIZER_STATE)
        site_mode, alloc_mode = make_modes(torch, rec)
        shapes: list[tuple[int, ...]] = []
        quiet = _Quiet()
        with _hooks(torch, rec, lent, reach.optimizers), _eager(torch):
            run = 0
            while run < runs or (run < MAX_RUNS and len(set(shapes)) > 1 and shapes[-1] != shapes[0]):
                run += 1
                rec.run, rec.phase = run, STEP
                rec.marks.append(len(rec.events))
                try:
                    with quiet, fake_mode, alloc_mode, site_mode:
                        step(batch_size)
                except KeyboardInterrupt:
                    raise  # the whole plan stops (the model is given back below)
                except BaseException as exc:  # noqa: BLE001 (the user's step, on stand-ins: said in a sentence)
                    raise PlanError(explain(exc, rec)) from None
                rec.end_run()
                shapes.append(tuple(a.nbytes for is_alloc, a in rec.events[rec.marks[-1]:]
                                    if is_alloc and a.phase == FORWARD))
        if len(set(shapes)) > 1:
            rec.varying = len(shapes)
    finally:
        lent.give_back()
    return rec
