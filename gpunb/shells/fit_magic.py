"""``%gpufit STEP``: the largest batch size a training step runs with, found in a few trials."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import cuda_device, decimal, output_option, parse_args, usage_error, whole_number


@magics_class
class FitMagics(Magics):
    @magic_arguments()
    @argument("step", metavar="STEP",
              help="Name of a function step(batch_size) that runs one training step (forward, backward, "
                   "optimizer step) at that batch size.")
    @argument("--start", type=whole_number(1), default=2, metavar="N",
              help="First probe batch size, 1 or more (default 2).")
    @argument("--max-batch", type=whole_number(1), default=None, metavar="N",
              help="Never try more than N (at least --start).")
    @argument("--margin", type=decimal(0, 0.9, high_open=True), default=0.05, metavar="F",
              help="Safety margin for the recommended size, a fraction from 0 to below 0.9 "
                   "(default 0.05 = 5 %%).")
    @argument("--device", type=cuda_device, default=None, metavar="DEV",
              help="CUDA device: cuda, cuda:N or N (default: the current one).")
    @argument("--steps", type=whole_number(1), default=2, metavar="N",
              help="Steps per trial, 1 or more; the last one is measured (default 2: the first creates "
                   "optimizer state).")
    @argument("--max-trials", type=whole_number(2), default=6, metavar="N",
              help="Give up after N trials, 2 or more (default 6).")
    @output_option("the BatchFit result")
    @line_magic
    def gpufit(self, line: str = "") -> None:
        """Find the largest batch size that fits on the GPU for a training step, without crashing.

        Runs STEP at two small batch sizes, fits peak memory as a line in the batch size,
        predicts the largest batch that fits, verifies it by running it (an out-of-memory
        error there is caught and freed) and refines until within 5 %. Shows progress while
        it runs, then the trials, the prediction and the memory curve. Resets torch's
        peak-memory counters.

        Python: ``gpunb.fit_batch_size(step, start=2, max_batch=None, margin=0.05)``.

        Example::

            def step(bs):
                x = torch.randn(bs, 3, 224, 224, device="cuda")
                loss = model(x).logsumexp(1).mean()
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

            %gpufit step --max-batch 4096 -o fit
        """
        args = parse_args(self.gpufit, line)
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
            raise usage_error(self.gpufit, f"STEP {args.step!r} is a {type(step).__name__}, "
                                           "not a function of the batch size.")
        missing = _missing_device(args.device)
        if missing:
            raise usage_error(self.gpufit, missing)
        from gpunb.shells.api import fit_batch_size

        result = fit_batch_size(step, start=args.start, max_batch=args.max_batch, margin=args.margin,
                                device=args.device, steps=args.steps, max_trials=args.max_trials)
        if args.output:
            self.shell.user_ns[args.output] = result
        from IPython.display import display

        display(result)


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
