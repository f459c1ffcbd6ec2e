"""``%gpumonitor``: the magic for :func:`gpunb.shells.monitor.monitor`, and its
registration (the sampler is stopped on ``%unload_ext`` / ``%reload_ext``)."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import parse_args


@magics_class
class MonitorMagics(Magics):
    @magic_arguments()
    @argument("--hz", type=float, default=None, metavar="HZ",
              help="samples per second, 0.5 to 10 (default 2, or the rate already running; one sampler "
                   "serves all monitors of this kernel at the fastest rate any of them asked for)")
    @argument("--window", type=float, default=120.0, metavar="SECONDS",
              help="seconds of history to show (default 120)")
    @argument("--device", type=int, default=None, metavar="N", help="show only GPU N (default: every GPU)")
    @argument("--stop", action="store_true",
              help="stop every monitor and the sampler thread; snapshots stay in the outputs")
    @argument("-o", dest="output", default=None, metavar="NAME",
              help="also store the Monitor object in variable NAME (.samples(), .to_pandas(), .stop())")
    @line_magic
    def gpumonitor(self, line: str = "") -> None:
        """Live GPU sparklines that keep drawing while your next cells train.

        For every GPU: memory (this kernel's share, other processes, free), utilization,
        power against its limit, temperature, SM clock, and a badge naming any active
        clock-event (throttle) reason; below them host CPU and RAM. One sampler thread per
        kernel reads NVML; a second ``%gpumonitor`` shares it. Pause and Stop buttons act
        once no cell is running; ``%gpumonitor --stop`` stops everything. A stopped
        monitor leaves a static snapshot, so the saved notebook still shows it. In
        terminal IPython it prints one line per GPU. Python API: ``gpunb.monitor()``.

        Examples::

            %gpumonitor
            %gpumonitor --hz 5 --window 300 --device 0 -o mon
            %gpumonitor --stop
        """
        from gpunb.shells.monitor import monitor, registry_for, stop_all

        args = parse_args(self.gpumonitor, line)
        if args.stop:
            n = stop_all(registry_for(self.shell))
            print(f"gpunb: stopped {n} monitor(s) and the sampler thread; their snapshots stay in the outputs."
                  if n else "gpunb: no monitor was running; the sampler thread is stopped.")
            return
        try:
            mon = monitor(hz=args.hz, window_s=args.window, device=args.device)  # no --hz: the running rate
        except ValueError as exc:  # bad values: say what and how, no traceback
            raise UsageError(f"%gpumonitor: {exc}") from None
        for message in mon.messages:
            if not message.startswith("No GPU to show"):  # the monitor itself says that
                print(f"gpunb: {message}")
        if args.output:
            self.shell.user_ns[args.output] = mon
        from IPython.display import display

        display(mon)


def _refresh_fallbacks(shared: dict[str, Any]):
    def post_run_cell(result: Any = None) -> None:
        for mon in list(shared.get("monitors", ())):
            try:
                mon.refresh_fallback()
            except Exception:  # a frontend gone away must not break the user's cells
                pass

    return post_run_cell


def _stop_on_unload(shared: dict[str, Any]):
    def stop() -> None:
        from gpunb.readings.nvml import stop_default_worker
        from gpunb.shells.monitor import stop_all

        stop_all(shared)
        shared.pop("sampler", None)  # a reload starts a fresh one with the reloaded code
        stop_default_worker()  # the NVML worker thread too (the next read starts a new one)

    return stop


def register(shell: Any, state: Any) -> None:
    # A sampler started by gpunb.monitor() before %load_ext becomes the extension's
    # (looked up without importing the monitor module: %load_ext stays cheap).
    monitor_module = sys.modules.get("gpunb.shells.monitor")
    standalone = getattr(monitor_module, "_STANDALONE", {})
    for key in ("sampler", "monitors"):
        if key in standalone:
            state.shared.setdefault(key, standalone.pop(key))
    for mon in state.shared.get("monitors", ()):
        mon._registry = state.shared
    state.add_magics(MonitorMagics(shell))
    state.on_unload(_stop_on_unload(state.shared))
    state.on("post_run_cell", _refresh_fallbacks(state.shared))
