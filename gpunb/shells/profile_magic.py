"""``%%gpuprofile`` (one cell measured), ``%gpuprofile on|off`` (one line after every cell)
and ``%gpuprofile history`` (profiled cells compared).

The cell body runs in the user's namespace, compiled under the cell's own name, so a
traceback looks exactly as without gpunb; the error is then marked on the cell's result,
so the kernel reports the cell as failed (nbclient stops, the OOM doctor sees it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.analysis.profile.cell import ProfileSession
from gpunb.analysis.profile.history import RunOf
from gpunb.analysis.profile.meter import CellMeter
from gpunb.analysis.profile.records import HistoryReport
from gpunb.shells import cell_runner
from gpunb.shells.arguments import (
    free_text,
    given,
    option_words,
    output_option,
    parse_args,
    usage_error,
    whole_number,
)
from gpunb.shells.cell_numbers import running_cell_number
from gpunb.shells.kernel_state import KernelState
from gpunb.shells.report_place import ReportPlace
from gpunb.views.profile_view import one_line_text

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

# Options of the cell form that the line form's actions do not take, and those they do.
_CELL_OPTIONS = ("steps", "no_reset", "timeline", "label", "no_ranks", "output", "ops", "no_flops", "no_energy",
                 "tokens_per_sample", "no_leak")
_LINE_OPTIONS = {"on": ("no_reset",), "off": (), "history": ("clear", "output", "vs")}


class _OneLineMode:
    """pre/post_run_cell callbacks, registered once at load; cheap no-ops while
    ``kernel.one_line_meter`` is None (the mode is off). Each measured cell also goes to
    ``%gpuprofile history``, named by its ``In [n]`` and first line of code."""

    def __init__(self, kernel: KernelState, shell: Any = None) -> None:
        self.kernel = kernel
        self.shell = shell
        self._label = ""
        self._place: ReportPlace | None = None
        self._code = ""

    def pre(self, info: Any = None, *args: Any) -> None:
        meter = self.kernel.one_line_meter
        if meter is None:
            return
        raw = getattr(info, "raw_cell", "") or ""
        if not raw.lstrip().startswith(("%%gpuprofile", "%gpuprofile")):  # own report / the switch
            self._label = _first_code_line(raw)
            self._code = raw
            meter.start()
            # the line goes above what the cell prints (in a kernel; see report_place)
            self._place = ReportPlace(self.shell, "gpuprofile") if self.shell is not None else None

    def post(self, result: Any = None, *args: Any) -> None:
        meter = self.kernel.one_line_meter
        line = meter.stop() if meter is not None else None  # None too when the cell was not metered
        place, self._place = self._place, None
        if line is None:
            if place is not None:
                place.clear()
            return
        number = getattr(result, "execution_count", None)
        if not isinstance(number, int) and self.shell is not None:
            number = running_cell_number(self.shell)
        line = dataclasses.replace(line, cell=number if isinstance(number, int) else None, label=self._label)
        self.kernel.profile_history.add(line, RunOf.of(code=self._code))
        if place is None or not place.reserved:  # terminal IPython: printed after the cell, as autotime does
            print(one_line_text(line))
        else:
            place.fill(_OneLine(one_line_text(line)))


class _OneLine:
    """The one-line summary as a display (text only: it reads the same everywhere)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text}


@magics_class
class ProfileMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    def __init__(self, shell: Any, kernel: KernelState) -> None:
        super().__init__(shell)
        self.kernel = kernel

    @magic_arguments()
    @argument("action", nargs="?", choices=("on", "off", "history"),
              help="line form only: `on`/`off` a one-line summary after every cell "
                   "(time · peak VRAM · GPU util · energy); `history` the table of profiled cells")
    @argument("--steps", type=whole_number(0), default=None, metavar="N",
              help="warm-up optimizer steps left out of median/p90, 0 or more (default 1)")
    @argument("--no-reset", action="store_true",
              help="leave torch's global peak-memory counter untouched (by default a profiled cell "
                   "resets it with torch.cuda.reset_peak_memory_stats, which code reading "
                   "max_memory_allocated() across cells will notice)")
    @argument("--timeline", dest="timeline", action="store_const", const=True, default=None,
              help="draw the memory timeline (default)")
    @argument("--no-timeline", dest="timeline", action="store_const", const=False,
              help="no memory timeline (no memory reads at step ends)")
    @argument("--no-ranks", action="store_true",
              help="do not profile the worker processes the cell starts (by default torchrun, "
                   "torch.multiprocessing and accelerate.notebook_launcher ranks report their step times and "
                   "memory: the cell's processes inherit GPUNB_RANK_CHANNEL and a PYTHONPATH entry)")
    @argument("--label", type=free_text, default=None, metavar="TEXT",
              help="a name for this run in the history table (default: the cell's first line of code)")
    @argument("--ops", action="store_true",
              help="trace steps 4-6 with torch.profiler: top operators and kernels, the share of time in "
                   "matmul/attention/elementwise/communication/idle, a Chrome/Perfetto trace file next to "
                   "the notebook (steps 3-7 are left out of the step times)")
    @argument("--no-flops", action="store_true",
              help="do not count the FLOPs of step 2 (by default they are counted, for TFLOP/s and MFU; "
                   "the counted step is left out of the step times)")
    @argument("--no-energy", action="store_true",
              help="do not meter energy and link traffic (by default NVML's energy counter of the cell's GPUs is "
                   "read at its start, its end and at most every 0.25 s at step ends, and PCIe throughput every "
                   "0.5 s, all in the background: J per step and per sample, Wh, average W, host→GPU GB/s)")
    @argument("--tokens-per-sample", type=whole_number(1), default=None, metavar="N",
              help="tokens in one sample (the sequence length), for tokens/s and tokens/J (by default read from "
                   "the first batch when it holds token ids: a 2-D integer tensor, or a dict's input_ids)")
    @argument("--no-leak", action="store_true",
              help="do not look for memory that grows every step (by default a few censuses of the notebook's "
                   "variables at step ends after the warm-up, within 0.5%% of the cell's time, name what holds it)")
    @argument("--clear", action="store_true", help="with `history`: forget the profiled cells")
    @argument("--vs", type=free_text, default=None, metavar="LABEL",
              help="with `history`: compare every profiled cell with the latest run labelled LABEL, like for "
                   "like (time per sample when the batch sizes are known, else per step), in one sentence each")
    @output_option("the result object (CellProfile; with `history` the HistoryReport)")
    @line_cell_magic
    def gpuprofile(self, line: str, cell: str | None = None) -> Any:
        """Profile a cell: time, training steps, peak VRAM, where the time went, a verdict.

        ::

          %%gpuprofile [--steps N] [--no-reset] [--timeline | --no-timeline] [--no-ranks] [--label TEXT]
                       [--ops] [--no-flops] [--no-energy] [--tokens-per-sample N] [--no-leak]
                       [-o NAME]
          <training code>

          %gpuprofile on [--no-reset]   one line after every cell
          %gpuprofile off
          %gpuprofile history [--clear | --vs LABEL | -o NAME]

        Steps are optimizer.step() calls, timed with CUDA events read at the end of the cell
        (no per-step synchronize). Data wait is time inside DataLoader iterators; host syncs
        are .item()/.cpu()/.tolist()/printing of tensors. The FLOPs of step 2 are counted on
        the operations that ran, for TFLOP/s and MFU against the datasheet peak and the one
        %gpucheck measured; --ops adds torch.profiler's view of steps 4-6. Energy comes from
        NVML's energy counter (power samples, marked as an estimate, where it is missing), per
        step over steady windows of at least 1 s, with PCIe/NVLink traffic. Worker processes the
        cell starts (torchrun, torch.multiprocessing, accelerate.notebook_launcher) report per
        rank: step times, peak VRAM, data wait, DDP's all-reduce time; the slowest rank is named.
        Memory that grows with every step after the warm-up is reported with the variable that
        holds it and the fix (`preds.append(logits)`: append `logits.detach()`); --no-leak turns it off.
        Without a GPU it reports wall/CPU time, peak RSS, steps, FLOPs and TFLOP/s and says the
        GPU parts are absent. A bad option fails the cell before its code runs.
        API twin: ``with gpunb.profile() as p: ...``.
        """
        args = parse_args(self.gpuprofile, line)
        if args is None:  # --help: the usage was printed, the cell's code is not run
            if cell is not None:
                print("(the cell did not run: remove --help to profile it)")
            return None
        if cell is None:
            return self._line(args)
        if args.action is not None:
            raise usage_error(self.gpuprofile, f"`{args.action}` is for the line magic (%gpuprofile {args.action}), "
                                               "not for a %%gpuprofile cell; the cell did not run")
        if args.clear:
            raise usage_error(self.gpuprofile, "--clear is for `%gpuprofile history`; the cell did not run")
        if args.vs is not None:
            raise usage_error(self.gpuprofile, "--vs is for `%gpuprofile history`; the cell did not run")
        return self._profile_cell(args, cell)

    # -- line form ------------------------------------------------------------------------
    def _line(self, args: Any) -> Any:
        if args.action is None:
            state = "on" if self.kernel.one_line_meter is not None else "off"
            raise usage_error(self.gpuprofile, f"say what to do: on, off or history (one-line mode is {state}); "
                                               "to profile a cell, start it with %%gpuprofile")
        allowed = _LINE_OPTIONS[args.action]
        wrong = [name for name in given(self.gpuprofile, args, *_CELL_OPTIONS, "clear", "vs") if name not in allowed]
        if wrong:
            takes = f"takes only {option_words(list(allowed))}" if allowed else "takes no options"
            raise usage_error(self.gpuprofile, f"`%gpuprofile {args.action}` {takes} (got {option_words(wrong)})")
        if args.action == "on":
            self.kernel.one_line_meter = CellMeter(reset_peak=not args.no_reset)
            print("gpuprofile: one line after every cell (time · peak VRAM · GPU util · energy); "
                  "`%gpuprofile off` to stop" + ("" if not args.no_reset else "; torch's peak counter is left alone"))
            return None
        if args.action == "off":
            was_on = self.kernel.one_line_meter is not None
            self.kernel.one_line_meter = None
            print("gpuprofile: one-line summaries off" if was_on else "gpuprofile: one-line summaries were not on")
            return None
        history = self.kernel.profile_history
        if args.clear:
            if args.vs is not None:
                raise usage_error(self.gpuprofile, "`history --clear` compares nothing; leave out --vs")
            if args.output:
                raise usage_error(self.gpuprofile, "`history --clear` binds nothing; leave out -o")
            history.clear()
            print("gpuprofile: history cleared")
            return None
        baselines = history.baselines()
        if args.vs is not None:
            named = history.baselines_vs(args.vs)
            if named is None:
                labels = sorted({x for x in history.labels() if x})
                known = ", ".join(f'"{x}"' for x in labels) if labels else "none (name runs with --label)"
                raise usage_error(self.gpuprofile, f'no profiled cell is labelled "{args.vs.strip()}"; '
                                                   f"the labels are: {known}")
            baselines = named
        report = HistoryReport(tuple(history.entries()), baselines, versus=(args.vs or "").strip())
        if args.output:
            self.shell.user_ns[args.output] = report
        self._display(report)
        return None

    # -- cell form ------------------------------------------------------------------------
    def _profile_cell(self, args: Any, cell: str) -> Any:
        shell = self.shell
        number = running_cell_number(shell)  # In [n]: the report, the history and tracebacks agree
        try:
            code, last_expr = self._compile(cell, number)
        except SyntaxError:
            shell.showsyntaxerror()
            self._mark_failed(before_exec=True)
            return None
        label = args.label or _first_code_line(cell)
        session = ProfileSession(label=label, cell=number,
                                 warmup_steps=args.steps if args.steps is not None else 1,
                                 reset_peak=not args.no_reset, timeline=args.timeline is not False,
                                 flops=not args.no_flops, ops=args.ops, ranks=not args.no_ranks,
                                 energy=not args.no_energy, tokens_per_sample=args.tokens_per_sample,
                                 leak=not args.no_leak, namespace=shell.user_ns)
        try:
            session.start()
        except Exception as exc:  # never keep the user's cell from running
            print(f"gpunb: could not start profiling ({type(exc).__name__}: {exc}); running the cell unprofiled.")
            session.abort()
            value, error = self._run(code, last_expr)
            return self._finish(value, error, cell)
        try:
            place = ReportPlace(shell, f"gpuprofile In [{number}]" if number is not None else "gpuprofile")
        except BaseException:  # a Ctrl-C here too: no hook may stay in
            session.abort()
            raise
        try:  # a Ctrl-C between start, the cell and stop still takes every hook out
            value, error = self._run(code, last_expr)
            profile = session.stop(error)
        except Exception as exc:  # a gpunb bug must not cost the user their cell's result
            session.abort()
            print(f"gpunb: the profile could not be built ({type(exc).__name__}: {exc}); "
                  "the cell itself ran normally. Please report this at the gpunb issue tracker.")
            profile = None
        except BaseException:  # a Ctrl-C in gpunb's stop: the hooks are out (stop aborted), the cell is interrupted
            session.abort()
            place.clear()
            raise
        if profile is not None:
            if args.timeline is False:
                profile.extra["timeline"] = False
            self.kernel.profile_history.add(profile, RunOf.of(label=args.label or "", code=cell))
            if args.output:
                shell.user_ns[args.output] = profile
            place.fill(profile)  # above what the cell printed (see report_place)
        else:
            place.clear()
        return self._finish(value, error, cell)

    # Running the body as IPython runs a cell (named `In [n]`, the traceback from the user's
    # frame on, the result marked failed for post_run_cell hooks): shells/cell_runner.py.
    def _finish(self, value: Any, error: BaseException | None, cell: str) -> Any:
        return cell_runner.finish(self.shell, value, error, cell)

    def _compile(self, cell: str, number: int | None) -> tuple[Any, Any]:
        return cell_runner.compile_cell(self.shell, cell, number)

    def _run(self, code: Any, last_expr: Any) -> tuple[Any, BaseException | None]:
        return cell_runner.run_compiled(self.shell, code, last_expr)

    def _mark_failed(self, error: BaseException | None = None, before_exec: bool = False) -> None:
        cell_runner.mark_failed(self.shell, error=error, before_exec=before_exec)

    def _display(self, obj: Any) -> None:
        from IPython.display import display

        display(obj)


def _first_code_line(cell: str, width: int = 40) -> str:
    """A default label for the history table: the cell's first line of code."""
    for line in cell.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""


def register(shell: Any, state: Any) -> None:
    kernel = state.kernel
    mode = _OneLineMode(kernel, shell)
    state.add_magics(ProfileMagics(shell, kernel))
    state.on("pre_run_cell", mode.pre)
    state.on("post_run_cell", mode.post)

    def _off() -> None:
        kernel.one_line_meter = None

    state.on_unload(_off)
