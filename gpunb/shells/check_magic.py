"""``%gpucheck``: the setup checklist in a notebook, with live progress while it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.analysis.checks.checklist import CheckOptionError, check
from gpunb.shells.arguments import output_option, parse_args, usage_error, whole_number

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class CheckMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    @magic_arguments()
    @argument("--quick", action="store_true",
              help="Skip the subprocess measurements (CUDA smoke test, matmul and copy speed): well under a second.")
    @argument("--deep", action="store_true",
              help="Also the slow multi-GPU measurement: an NCCL all-reduce across every GPU, one subprocess "
                   "each, its sum checked and its bus bandwidth compared with the links (about 10 s more; "
                   "killed after 90 s if it hangs).")
    @argument("--device", type=whole_number(0), default=None, metavar="N",
              help="Check only cuda:N (numbered as CUDA sees GPUs under CUDA_VISIBLE_DEVICES).")
    @argument("--json", action="store_true", help="Print the report as JSON instead of the formatted checklist.")
    @argument("--require-gpu", action="store_true",
              help="A machine without an NVIDIA GPU fails the check (by default it skips the GPU checks: "
                   "a laptop's ordinary state).")
    @output_option("the CheckReport")
    @line_magic
    def gpucheck(self, line: str = "") -> None:
        """Run the GPU training setup checklist and show each check's status, cause and fix.

        Checks the NVIDIA driver and GPUs, other processes, the torch build against the driver
        and the GPU architecture, cuDNN/NCCL, CUDA_VISIBLE_DEVICES, a CUDA smoke test with
        matmul and copy speed (in a subprocess, so this kernel gets no CUDA context), this
        kernel's CUDA state, how the GPUs are joined (NVLink or PCIe, peer access),
        temperature, power, throttling, ECC, persistence/MIG/compute modes, TF32/bf16, host
        CPU/RAM, /dev/shm, disk, PYTORCH_CUDA_ALLOC_CONF, JAX/TF. ``--deep`` adds an NCCL
        all-reduce across the GPUs (subprocesses, hard timeout).

        The same report: ``gpunb.check()`` in Python, ``gpunb check`` in a terminal.

        Examples::

            %gpucheck
            %gpucheck --quick
            %gpucheck --deep
            %gpucheck --device 1 -o report
            %gpucheck --json
        """
        args = parse_args(self.gpucheck, line)
        if args is None:  # --help: the usage was printed
            return
        if args.quick and args.deep:
            raise usage_error(self.gpucheck, "--quick and --deep exclude each other (--quick skips the "
                                             "measurements that --deep adds to)")
        from gpunb.shells.cancel_button import CancelButton
        from gpunb.shells.check_progress import CheckProgress

        handle = CheckProgress(self.shell) if not args.json else None  # progress, then the report in its place
        # the full check takes seconds (subprocesses): a Cancel button beside its progress
        cancel = CancelButton.shown("the check", self.shell) if handle is not None and not args.quick else None
        try:
            try:
                report = check(quick=args.quick, device=args.device, deep=args.deep,
                               progress=handle.update if handle else None, in_kernel=True,
                               require_gpu=args.require_gpu)
            finally:
                if cancel is not None:
                    cancel.done()  # a click from now on interrupts nothing
        except CheckOptionError as exc:
            if handle:
                handle.clear()
            raise usage_error(self.gpucheck, str(exc)) from None
        except KeyboardInterrupt:
            if handle:
                handle.interrupted(cancelled=cancel is not None and cancel.cancelled)
            if cancel is not None and cancel.cancelled:
                return  # the user's own click: said in the output, no traceback
            raise
        except BaseException:  # a bug: the ticking progress line must not go on
            if handle:
                handle.interrupted()
            raise
        if args.output:
            self.shell.user_ns[args.output] = report
        if args.json:
            print(report.to_json())
        elif handle is not None:
            handle.finish(report)


def register(shell: Any, state: Any) -> None:
    state.add_magics(CheckMagics(shell))
