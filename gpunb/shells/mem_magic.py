"""``%gpumem``: where GPU memory goes; free variables; release a failed cell; keep tracebacks.
``%%gpumem --trace``: which lines of a cell allocated its peak; ``%gpumem --trace on|off``: arm
torch's allocation history so the OOM doctor names the lines behind an OOM."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
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
    @argument("--trace", nargs="?", const="cell", choices=["on", "off", "cell"], default=None, metavar="on|off",
              help="On a cell (%%%%gpumem --trace): record the allocations of the cell and show the lines that "
                   "made its peak, memory by role over the cell, what was alive at the peak. On a line: on/off "
                   "arms/disarms torch's allocation history, so the OOM doctor names the lines behind an OOM "
                   "(costs ~2 us per allocation while on).")
    @argument("--save", metavar="PATH", default=None,
              help="With %%%%gpumem --trace: also write torch's raw snapshot (a pickle for "
                   "https://pytorch.org/memory_viz) to PATH, a new file.")
    @argument("--max-entries", type=whole_number(100), default=None, metavar="N",
              help="Allocation events kept (default 100000 for a cell, 20000 while armed).")
    @argument("--all-devices", action="store_true", help="List tensors on every device, CPU included.")
    @argument("--top", type=whole_number(1), default=20, metavar="N",
              help="Show the N largest tensors, 1 or more (default 20).")
    @output_option("the MemoryReport (the MemoryTrace with --trace)")
    @line_cell_magic
    def gpumem(self, line: str = "", cell: str | None = None) -> Any:
        """Show where GPU memory goes: per GPU, NVML used vs this kernel vs torch allocated/reserved
        vs CUDA context; the live tensors by notebook variable (model.fc.weight, its .grad,
        opt.state[model.fc.weight].exp_avg), largest first; leftovers only the output history
        or an old error keeps alive.

        On a cell, ``%%gpumem --trace`` records the cell's CUDA allocations (torch's allocation
        history, on for that cell only) and shows the lines of your code behind its peak, memory
        by role over the cell with the peak marked, and what was alive at the peak.

        Python: ``gpunb.memory(free=[...], top=20)``; ``with gpunb.trace_memory():``. The OOM
        doctor runs by itself after a CUDA out-of-memory error and frees what the failed cell pinned.

        Examples::

            %gpumem
            %gpumem --free big_batch old_model
            %gpumem --release
            %gpumem --keep-traceback on     # keep frames after an OOM, for %debug
            %gpumem --top 50 -o mem
            %%gpumem --trace                # on a cell: the lines that made its peak
            %%gpumem --trace --save snap.pickle
            %gpumem --trace on              # the OOM doctor names the lines (until --trace off)
        """
        args = parse_args(self.gpumem, line)
        if args is None:  # --help: the usage was printed
            return None
        if cell is not None or args.trace is not None or args.save is not None or args.max_entries is not None:
            return self._trace(args, cell)
        if args.keep_traceback is not None:
            self.kernel.oom_keep_traceback = args.keep_traceback == "on"
            if self.kernel.oom_keep_traceback:
                print("gpunb: after an OOM the failed cell's frames are kept for %debug (memory stays pinned "
                      "until %gpumem --release).")
            else:
                print("gpunb: after an OOM the failed cell's frames are released (memory comes back; "
                      "%debug has no frames for that error).")
            if not given(self.gpumem, args, "free", "release", "all_devices", "top", "output"):
                return None  # only the setting; any other option asks for the report as well
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
        return None

    def end_cell_traces(self, result: Any = None) -> None:
        """After every cell: a traced cell's history ends with it, even when a Ctrl-C cut its
        stop short (the armed one stays on until `--trace off`)."""
        from gpunb.readings.alloc_history import switch_off_ours

        switch_off_ours(keep=self.kernel.alloc_history)

    def disarm(self) -> None:
        """Switch the armed history off (``--trace off``, ``%unload_ext``)."""
        from gpunb.readings.alloc_history import switch_off_ours

        current, self.kernel.alloc_history = self.kernel.alloc_history, None
        try:
            if current is not None:
                current.stop()
        finally:  # and any history a Ctrl-C cut off before gpunb could switch it off
            switch_off_ours()

    # -- allocation history -------------------------------------------------------------------
    def _trace(self, args: Any, cell: str | None) -> Any:
        others = given(self.gpumem, args, "free", "release", "keep_traceback", "all_devices", "top")
        if others:
            from gpunb.shells.arguments import option_words

            raise usage_error(self.gpumem, f"--trace does not combine with {option_words(others)}; "
                                           "run them as two commands")
        if cell is None:
            if args.trace in ("on", "off"):
                if args.save is not None:
                    raise usage_error(self.gpumem, "--save is for a traced cell (%%gpumem --trace --save PATH)")
                return self._arm(args.trace == "on", args.max_entries)
            raise usage_error(self.gpumem, "to trace a cell, start the cell with %%gpumem --trace; on a line, "
                                           "--trace takes on or off")
        if args.trace in ("on", "off"):
            raise usage_error(self.gpumem, f"--trace {args.trace} is for the line magic (%gpumem --trace "
                                           f"{args.trace}); the cell did not run")
        return self._trace_cell(args, cell)

    def _arm(self, on: bool, max_entries: int | None) -> None:
        from gpunb.readings.alloc_history import ARMED_MAX_ENTRIES, arm, unavailable
        from gpunb.readings.torch_state import imported_torch

        current = self.kernel.alloc_history
        if not on:
            self.disarm()
            print("gpunb: allocation history off; the OOM doctor explains OOMs without stacks.")
            return
        torch: Any = imported_torch()
        reason = unavailable(torch)
        if reason:
            print(f"gpunb: allocation history not armed: {reason}.")
            return
        if current is None:
            self.kernel.alloc_history = arm(torch, max_entries or ARMED_MAX_ENTRIES)
        print("gpunb: allocation history on: after a CUDA out-of-memory error the OOM doctor names the lines that "
              "allocated the memory (torch records ~2 us per allocation; `%gpumem --trace off` stops it).")

    def _trace_cell(self, args: Any, cell: str) -> Any:
        from gpunb.analysis.memory.alloc_sites import shell_cell_numbers
        from gpunb.analysis.memory.alloc_trace import TraceSession
        from gpunb.readings.alloc_history import CELL_MAX_ENTRIES
        from gpunb.readings.torch_state import imported_torch
        from gpunb.shells.cell_numbers import running_cell_number
        from gpunb.shells.cell_runner import compile_cell, finish, mark_failed, run_compiled
        from gpunb.shells.report_place import ReportPlace

        shell = self.shell
        number = running_cell_number(shell)
        try:
            code, last_expr = compile_cell(shell, cell, number)
        except SyntaxError:
            shell.showsyntaxerror()
            mark_failed(shell, before_exec=True)
            return None
        session = TraceSession(torch=imported_torch(), namespace=shell.user_ns,
                               cell_numbers=lambda: shell_cell_numbers(shell.compile),
                               label=f"In [{number}]" if number is not None else "", save_path=args.save,
                               max_entries=args.max_entries or CELL_MAX_ENTRIES)
        try:  # a Ctrl-C anywhere (start, the cell, stop) still puts the history back as it was
            session.start()
            place = ReportPlace(shell, f"gpumem --trace In [{number}]")
            value, error = run_compiled(shell, code, last_expr)
        finally:
            trace = session.stop()
        if error is not None:
            trace.error = type(error).__name__
        if args.output:
            shell.user_ns[args.output] = trace
        place.fill(trace)
        return finish(shell, value, error, cell)


def register(shell: Any, state: Any) -> None:
    magics = MemMagics(shell, state.kernel)
    state.add_magics(magics)
    state.on_unload(magics.disarm)  # torch's history stays on only while the extension is loaded
    state.on("post_run_cell", magics.end_cell_traces)
