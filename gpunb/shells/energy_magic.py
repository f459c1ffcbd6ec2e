"""``%gpuenergy``: what the kernel's GPUs spent since ``%load_ext gpunb``, and the price and carbon
intensity every energy figure of the kernel is priced with.

The counters are first read right after the load cell (or before the first cell, when the
extension loads at start-up), on the NVML worker: the load itself never waits for NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpunb.shells.arguments import free_text, output_option, parse_args, usage_error
from gpunb.shells.kernel_state import KernelState

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class EnergyMagics(Magics):
    shell: InteractiveShell  # set by IPython when it registers these magics

    def __init__(self, shell: Any, kernel: KernelState) -> None:
        super().__init__(shell)
        self.kernel = kernel

    @magic_arguments()
    @argument("--price", type=free_text, default=None, metavar="PRICE",
              help="Your electricity price per kWh, e.g. 0.25/kWh, €0.25/kWh, 0.25 EUR/kWh (kept for this kernel; "
                   "env GPUNB_ENERGY_PRICE does the same for every kernel).")
    @argument("--carbon", type=free_text, default=None, metavar="INTENSITY",
              help="Your grid's carbon intensity, e.g. 350g/kWh (kept for this kernel; env GPUNB_CARBON_INTENSITY "
                   "does the same for every kernel).")
    @argument("--forget", action="store_true",
              help="Forget the price and carbon set in this kernel (the environment's apply again, if any).")
    @output_option("the SessionEnergy")
    @line_magic
    def gpuenergy(self, line: str = "") -> None:
        """Show what this kernel's GPUs spent since %load_ext gpunb: Wh and average W per GPU and
        in all, money and CO₂ when you set a price, and the last profiled cell's energy.

        gpunb knows no region's price: without --price/--carbon (or the GPUNB_ENERGY_PRICE /
        GPUNB_CARBON_INTENSITY variables) it shows energy only. A price set here is used by
        every energy figure of this kernel (%%gpuprofile too), and the report shows at once
        what it makes of the energy so far.

        Python: ``gpunb.energy(price="0.25/kWh", carbon="350g/kWh")``.

        Examples::

            %gpuenergy
            %gpuenergy --price 0.25/kWh --carbon 350g/kWh
            %gpuenergy --price €0.31/kWh
            %gpuenergy --forget
            %gpuenergy -o spent       # spent.wh, spent.joules, spent.gpus
        """
        args = parse_args(self.gpuenergy, line)
        if args is None:  # --help: the usage was printed
            return
        if args.forget and (args.price is not None or args.carbon is not None):
            raise usage_error(self.gpuenergy, "--forget clears the price and carbon: give it alone")
        from gpunb.shells.api import set_tariff

        if args.forget or args.price is not None or args.carbon is not None:
            try:
                said = set_tariff(price=args.price, carbon=args.carbon, forget=args.forget)
            except ValueError as exc:
                raise usage_error(self.gpuenergy, str(exc)) from None
            # A new price shows at once what it makes of the energy so far: the report's last line
            # names the tariff. --forget leaves none to name, so it is said here.
            if args.forget:
                print(f"gpunb: {said}")
                if args.output is None:
                    return  # only the clearing; -o asks for the report as well
        from gpunb.shells.api import energy

        report = energy(state=self.kernel)
        if args.output:
            self.shell.user_ns[args.output] = report
        from IPython.display import display

        display(report)


def register(shell: Any, state: Any) -> None:
    from gpunb.analysis.energy.since_load import SinceLoad

    def nvml() -> Any:
        from gpunb.readings.nvml import default_session

        return default_session()

    state.kernel.energy_since_load = SinceLoad(nvml)

    def first_reading(*_: Any) -> None:
        # after the %load_ext cell (or before the first cell when loaded at start-up): the
        # load itself stays free of NVML
        since = state.kernel.energy_since_load
        if since is not None and not since.begun:
            since.begin()

    state.add_magics(EnergyMagics(shell, state.kernel))
    state.on("pre_run_cell", first_reading)
    state.on("post_run_cell", first_reading)
