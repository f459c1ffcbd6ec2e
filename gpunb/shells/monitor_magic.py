"""``%gpumonitor``: the magic for :func:`gpunb.shells.monitor.monitor`, and its
registration (the sampler is stopped on ``%unload_ext`` / ``%reload_ext``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.analysis.monitor.sampler import HZ_DEFAULT, HZ_MAX, HZ_MIN, WINDOW_MAX_S, WINDOW_MIN_S
from gpunb.shells.arguments import (
    decimal,
    given,
    option_words,
    output_option,
    parse_args,
    usage_error,
    whole_number,
)
from gpunb.shells.kernel_state import KernelState

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class MonitorMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    def __init__(self, shell: Any, kernel: KernelState) -> None:
        super().__init__(shell)
        self.kernel = kernel

    @magic_arguments()
    @argument("--hz", type=decimal(HZ_MIN, HZ_MAX), default=None, metavar="HZ",
              help=f"samples per second, {HZ_MIN:g} to {HZ_MAX:g} (default {HZ_DEFAULT:g}, or the rate already "
                   "running; one sampler serves all monitors of this kernel at the fastest rate any asked for)")
    @argument("--window", type=decimal(WINDOW_MIN_S, WINDOW_MAX_S), default=None, metavar="SECONDS",
              help=f"seconds of history to show, {WINDOW_MIN_S:g} to {WINDOW_MAX_S:.0f} (default 120)")
    @argument("--device", type=whole_number(0), default=None, metavar="N",
              help="show only GPU N (default: every GPU)")
    @argument("--stop", action="store_true",
              help="stop every monitor and the sampler thread; their last frames stay in the outputs")
    @output_option("the Monitor object (.samples(), .to_pandas(), .stop())")
    @line_magic
    def gpumonitor(self, line: str = "") -> None:
        """Live GPU charts that keep drawing while your next cells train.

        Per GPU a row of panels (they wrap in a narrow window): memory (this kernel's share
        and other processes', on a scale that follows what is used, with the capacity beside
        it), utilization, power against its limit, temperature against the slowdown
        threshold, SM clock, and a badge naming any active clock-event (throttle) reason;
        a line with the energy the GPUs spent since the monitor started (priced when you set
        a price with ``%gpuenergy`` or GPUNB_ENERGY_PRICE); then the host's CPU and RAM, and
        PCIe (both ways) and NVLink traffic in GB/s against the link's peak. The time axis
        starts at the first sample until the window is full. Above the charts, Pause/Resume,
        Stop and the time window (ipywidgets; they act between cells, or while a cell
        awaits). One sampler thread per kernel reads NVML; a second ``%gpumonitor`` shares
        it. The charts are plain HTML redrawn in place, so a saved, shared or exported
        notebook shows the last frame (images that untrusted notebooks keep), and the
        controls are left out of saved files; ``%gpumonitor --stop`` stops every monitor and
        captions each output with the time it stopped. In terminal IPython it prints one
        line per GPU. Python API: ``gpunb.monitor()``.

        Examples::

            %gpumonitor
            %gpumonitor --hz 5 --window 300 --device 0 -o mon
            %gpumonitor --stop
        """
        from gpunb.shells.monitor import monitor, stop_all

        args = parse_args(self.gpumonitor, line)
        if args is None:  # --help: the usage was printed
            return
        if args.stop:
            others = given(self.gpumonitor, args, "hz", "window", "device", "output")
            if others:
                raise usage_error(self.gpumonitor, f"--stop takes no other options (got {option_words(others)})")
            n = stop_all(self.kernel)
            print(f"gpunb: stopped {n} monitor(s) and the sampler thread; their last frames, captioned with the "
                  "time they stopped, stay in the outputs."
                  if n else "gpunb: no monitor was running; the sampler thread is stopped.")
            return
        try:
            mon = monitor(hz=args.hz, window_s=args.window if args.window is not None else 120.0,
                          device=args.device)  # no --hz: the rate already running (see monitor())
        except ValueError as exc:  # a GPU that is not there: say what and how, no traceback
            raise usage_error(self.gpumonitor, str(exc)) from None
        for message in mon.messages:
            print(f"gpunb: {message}")
        if args.output:
            self.shell.user_ns[args.output] = mon
        from IPython.display import display

        display(mon)


def _stop_on_unload(kernel: KernelState):
    def stop() -> None:
        from gpunb.readings.nvml import stop_default_worker
        from gpunb.shells.monitor import stop_all

        stop_all(kernel)
        kernel.sampler = None  # a reload starts a fresh one with the reloaded code
        if "gpunb.readings.server_sessions" in sys.modules:  # the monitors' server link: its thread ends
            from gpunb.readings.server_sessions import set_default_sessions

            set_default_sessions(None)
        stop_default_worker()  # the NVML worker thread too (the next read starts a new one)

    return stop


def register(shell: Any, state: Any) -> None:
    # A sampler started by gpunb.monitor() before %load_ext is already the extension's:
    # the extension's KernelState took over the standalone one when it was made.
    state.add_magics(MonitorMagics(shell, state.kernel))
    state.on_unload(_stop_on_unload(state.kernel))
