"""``%gpumem``: where GPU memory goes; free variables; release a failed cell; keep tracebacks."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import given, output_option, parse_args, usage_error, whole_number
from gpunb.shells.kernel_state import KernelState

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class MemMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    def __init__(self, shell: Any, kernel: KernelState) -> None:
        super().__init__(shell)
        self.kernel = kernel

    @magic_arguments()
    @argument("--free", nargs="+", metavar="NAME", default=None,
              help="Delete these variables (everywhere, like %%xdel), collect garbage, empty torch's cache, "
                   "and report what came back.")
    @argument("--release", action="store_true",
              help="Release what the last error pins (its frames' locals, sys.last_*, the %%debug traceback, "
                   "output history holding CUDA tensors), then report what came back.")
    @argument("--keep-traceback", nargs="?", const="on", choices=["on", "off"], default=None,
              help="After an OOM, keep the failed cell's frames for %%debug instead of freeing them "
                   "(on/off; default off, or env GPUNB_KEEP_TRACEBACK=1).")
    @argument("--all-devices", action="store_true", help="List tensors on every device, CPU included.")
    @argument("--top", type=whole_number(1), default=20, metavar="N",
              help="Show the N largest tensors, 1 or more (default 20).")
    @output_option("the MemoryReport")
    @line_magic
    def gpumem(self, line: str = "") -> None:
        """Show where GPU memory goes: per GPU, NVML used vs this kernel vs torch allocated/reserved
        vs CUDA context; the live tensors by notebook variable (model.fc.weight, its .grad,
        opt.state[model.fc.weight].exp_avg), largest first; leftovers only the output history
        or an old error keeps alive.

        Python: ``gpunb.memory(free=[...], top=20)``. The OOM doctor runs by itself after a CUDA
        out-of-memory error and frees what the failed cell pinned.

        Examples::

            %gpumem
            %gpumem --free big_batch old_model
            %gpumem --release
            %gpumem --keep-traceback on     # keep frames after an OOM, for %debug
            %gpumem --top 50 -o mem
        """
        args = parse_args(self.gpumem, line)
        if args is None:  # --help: the usage was printed
            return
        if args.keep_traceback is not None:
            self.kernel.oom_keep_traceback = args.keep_traceback == "on"
            if self.kernel.oom_keep_traceback:
                print("gpunb: after an OOM the failed cell's frames are kept for %debug (memory stays pinned "
                      "until %gpumem --release).")
            else:
                print("gpunb: after an OOM the failed cell's frames are released (memory comes back; "
                      "%debug has no frames for that error).")
            if not given(self.gpumem, args, "free", "release", "all_devices", "top", "output"):
                return  # only the setting; any other option asks for the report as well
        if args.free:
            from gpunb.analysis.memory.report import refuse_session_names

            try:  # before anything is deleted or released: all or nothing
                refuse_session_names(args.free, self.shell.user_ns, self.shell)
            except ValueError as exc:
                raise usage_error(self.gpumem, str(exc)) from None
        if args.release:
            from gpunb.analysis.memory.release import release_failure
            from gpunb.readings.torch_state import cuda_initialized, imported_torch
            from gpunb.views.oom_view import release_lines

            torch: Any = imported_torch()  # the module, or None (then cuda is False)
            cuda = cuda_initialized(torch)
            last = getattr(sys, "last_value", None)
            released = release_failure(self.shell, last, torch=torch,
                                     device=torch.cuda.current_device() if cuda else None,
                                     devices={"cuda"} if cuda else None)
            what = "the last error" if last is not None else "(no error pinned)"
            print("\n".join([f"gpunb: released {what}", *release_lines(released)]))
        from gpunb.analysis.memory.report import memory

        report = memory(free=args.free or (), top=args.top, all_devices=args.all_devices,
                        namespace=self.shell.user_ns, shell=self.shell)
        if args.output:
            self.shell.user_ns[args.output] = report
        from IPython.display import display

        display(report)


def register(shell: Any, state: Any) -> None:
    state.add_magics(MemMagics(shell, state.kernel))
