"""``%gpufit STEP``: the largest batch size a training step runs with, found in a few trials."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import cuda_device, decimal, output_option, parse_args, usage_error, whole_number

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class FitMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    @magic_arguments()
    @argument("step", metavar="STEP",
              help="the name of a function step(batch_size) that runs one training step (forward, backward, "
                   "optimizer step) at that batch size.")
    @argument("--start", type=whole_number(1), default=2, metavar="N",
              help="First probe batch size, 1 or more (default 2).")
    @argument("--max-batch", type=whole_number(1), default=None, metavar="N",
              help="Never try more than N (at least --start).")
    @argument("--margin", type=decimal(0, 0.9, high_open=True), default=0.0, metavar="F",
              help="Keep this fraction of the memory free on top of what the trials measured, e.g. for "
                   "longer inputs than the step's or other programs; from 0 to below 0.9 (default 0).")
    @argument("--device", type=cuda_device, default=None, metavar="DEV",
              help="CUDA device: cuda, cuda:N or N (default: the current one).")
    @argument("--steps", type=whole_number(1), default=50, metavar="N",
              help="Steps per trial, 1 or more: each trial is a sustained run, its peaks taken over the "
                   "steps after the first (default 50).")
    @argument("--max-trials", type=whole_number(2), default=6, metavar="N",
              help="Give up after N trials, 2 or more (default 6).")
    @output_option("the BatchFit result")
    @line_magic
    def gpufit(self, line: str = "") -> None:
        """Find the largest batch size that trains on the GPU for a training step, without crashing.

        Every trial is a sustained run of STEP (--steps, 50) that starts as a fresh process
        would: the optimizer's state and the gradients emptied, the cache given back, so the
        state is created where a real run creates it (yours is set aside on the host and put
        back afterwards). Two small probes fit peak memory as a line in the batch size, a scout
        measures the allocator's overhead at large blocks, and candidates close in on the limit
        between batches that trained and batches that did not. The recommendation is 3 % below
        the largest batch that trained (fresh processes differ by a sample or two near the
        limit). An out-of-memory error in a trial is caught and freed. Shows progress while it
        runs, then the recommended batch with the memory it left free, the trials and the memory
        curve. The trials train the model (real optimizer steps). Resets torch's peak-memory
        counters.

        Python: ``gpunb.fit_batch_size(step, start=2, max_batch=None, steps=50, margin=0.0)``.

        Example::

            def step(bs):
                x = torch.randn(bs, 3, 224, 224, device="cuda")
                loss = model(x).logsumexp(1).mean()
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

            %gpufit step --max-batch 4096 -o fit
        """
        args = parse_args(self.gpufit, line)
        if args is None:  # --help: the usage was printed
            return
        if args.max_batch is not None and args.max_batch < args.start:
            raise usage_error(self.gpufit, f"--max-batch {args.max_batch} is below --start {args.start} "
                                           "(allowed: --start or more)")
        try:
            step = eval(args.step, self.shell.user_ns)  # noqa: S307  the user's own expression
        except Exception as exc:
            raise usage_error(self.gpufit, f"STEP {args.step!r} is not defined in the notebook "
                                           f"({type(exc).__name__}: {exc}). Define `def step(batch_size): ...` "
                                           "first.") from None
        if not callable(step):
            raise usage_error(self.gpufit, f"STEP {args.step!r} is {_kind_of(step)}, not a function: give the "
                                           "name of a function of the batch size, e.g. `def step(batch_size): "
                                           "...` then `%gpufit step`.")
        missing = _missing_device(args.device)
        if missing:
            raise usage_error(self.gpufit, missing)
        from gpunb.shells.api import fit_batch_size
        from gpunb.shells.cancel_button import CancelButton
        from gpunb.shells.fit_progress import FitProgress

        shown = FitProgress(self.shell, max_trials=args.max_trials, steps=args.steps)  # then the result in its place
        cancel = CancelButton.shown("the batch-size search", self.shell)
        try:
            try:
                result = fit_batch_size(step, start=args.start, max_batch=args.max_batch, margin=args.margin,
                                        device=args.device, steps=args.steps, max_trials=args.max_trials,
                                        progress=shown)
            finally:
                if cancel is not None:
                    cancel.done()  # a click from now on interrupts nothing
        except KeyboardInterrupt:
            shown.interrupted(cancelled=cancel is not None and cancel.cancelled)
            if cancel is not None and cancel.cancelled:
                return  # the user's own click: said in the output, no traceback
            raise
        except BaseException:
            shown.clear()
            raise
        if args.output:
            self.shell.user_ns[args.output] = result
        shown.finish(result)


def _kind_of(value: Any) -> str:
    """What a value is, in words: "a number (int)", "a string", "an object of type Model"."""
    if isinstance(value, bool):
        return f"the value {value}"
    if isinstance(value, (int, float, complex)):
        return f"a number ({type(value).__name__})"
    if isinstance(value, str):
        return "a string"
    name = type(value).__name__
    return f"an object of type {name}"


def _missing_device(device: str | None) -> str:
    """Why ``--device cuda:N`` names no GPU, when torch can tell (%gpufit is about to use
    CUDA anyway); "" otherwise (without torch or a GPU, fit_batch_size says what is missing)."""
    torch = sys.modules.get("torch")
    if device is None or ":" not in device or torch is None or not torch.cuda.is_available():
        return ""
    count = torch.cuda.device_count()
    index = int(device.split(":")[1])
    if index < count:
        return ""
    return f"--device {device}: no such GPU (allowed: cuda:0 to cuda:{count - 1}; torch sees {count})"


def register(shell: Any, state: Any) -> None:
    state.add_magics(FitMagics(shell))
