"""``%gpuplan STEP --batch N [--gpu NAME|GiB ...]``: a training step's peak GPU memory, planned without a GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import output_option, parse_args, usage_error, whole_number

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class PlanMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    @magic_arguments()
    @argument("step", metavar="STEP",
              help="the name of a function step(batch_size) that runs one training step (forward, backward, "
                   "optimizer step) at that batch size.")
    @argument("--batch", type=whole_number(1), default=None, metavar="N", help="The batch size to plan, 1 or more.")
    @argument("--gpu", action="append", default=None, metavar="NAME|GiB",
              help="A GPU to answer for, by name (T4, L4, A10, V100, RTX 3090, RTX 4090, A100, A100-80GB, L40S, "
                   "H100, H200) or by its memory in GiB (e.g. 24); repeat for more (default: T4, L4, A100 80 GB).")
    @output_option("the StepPlan result")
    @line_magic
    def gpuplan(self, line: str = "") -> None:
        """Predict a training step's peak GPU memory before running it, on any machine, GPU or not.

        STEP runs twice on stand-in tensors (the first step, which makes the optimizer's state, and a
        later one): no GPU memory is used, no CUDA context made, nothing trains; your model,
        optimizer and random generators are given back untouched. Every allocation is recorded with
        its role and line and replayed through a model of CUDA's caching allocator, with cuBLAS's
        workspaces and the CUDA context. Shows the peak and where it is, the error band from
        calibration on a real GPU, whether the batch fits each GPU and the largest batch that does,
        then the peak by role and by line (as %%gpumem --trace shows a measured cell).

        Python: ``gpunb.plan(step, batch_size, gpus=None)``.

        Example::

            device = "cuda" if torch.cuda.is_available() else "cpu"
            def step(bs):
                x = torch.randn(bs, 3, 224, 224, device=device)
                loss = model(x).logsumexp(1).mean()
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

            %gpuplan step --batch 64 --gpu T4 --gpu 24
        """
        args = parse_args(self.gpuplan, line)
        if args is None:  # --help: the usage was printed
            return
        if args.batch is None:
            raise usage_error(self.gpuplan, "missing --batch N: the batch size to plan, e.g. --batch 64")
        try:
            step = eval(args.step, self.shell.user_ns)  # noqa: S307  the user's own expression
        except Exception as exc:
            raise usage_error(self.gpuplan, f"STEP {args.step!r} is not defined in the notebook "
                                            f"({type(exc).__name__}: {exc}). Define `def step(batch_size): ...` "
                                            "first.") from None
        if not callable(step):
            raise usage_error(self.gpuplan, f"STEP {args.step!r} is not a function: give the name of a function "
                                            "of the batch size, e.g. `def step(batch_size): ...` then "
                                            "`%gpuplan step --batch 64`.")
        from gpunb.analysis.plan.gpus import gpu_named

        for name in args.gpu or ():
            try:
                gpu_named(name)
            except ValueError as exc:
                raise usage_error(self.gpuplan, f"--gpu {name}: {exc}") from None
        from IPython.display import display

        from gpunb.shells.api import plan

        result = plan(step, args.batch, args.gpu)
        if args.output:
            self.shell.user_ns[args.output] = result
        display(result)


def register(shell: Any, state: Any) -> None:
    state.add_magics(PlanMagics(shell))
