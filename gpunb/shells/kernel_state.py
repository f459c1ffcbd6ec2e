"""Everything gpunb keeps for one kernel, in one typed object.

The extension owns one :class:`KernelState` per IPython shell (made by ``%load_ext``,
emptied by ``%unload_ext``). Without the extension (``import gpunb`` in plain Python or
in a notebook that did not load it) the API twins use :data:`STANDALONE_STATE`. On load
the extension takes over what the standalone state already holds (a monitor started by
``gpunb.monitor()``, cells profiled by ``gpunb.profile()``); on unload the profiled cells
go back to it, so ``%reload_ext gpunb`` keeps the history.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpunb.analysis.profile_history import ProfileHistory

if TYPE_CHECKING:  # only for the annotations: importing these costs %load_ext time
    from gpunb.analysis.cell_meter import CellMeter
    from gpunb.analysis.oom import OomDiagnosis
    from gpunb.analysis.sampler import Sampler
    from gpunb.shells.monitor import Monitor


@dataclass(eq=False)
class KernelState:
    # %gpumonitor / gpunb.monitor(): the kernel's one sampler thread (None until the first
    # monitor) and the monitors drawing from it.
    sampler: Sampler | None = None
    monitors: list[Monitor] = field(default_factory=list)
    # %%gpuprofile / gpunb.profile(): the profiled cells, for %gpuprofile history.
    profile_history: ProfileHistory = field(default_factory=ProfileHistory)
    # %gpuprofile on: the meter timing every cell; None while the one-line mode is off.
    one_line_meter: CellMeter | None = None
    # The OOM doctor: keep a failed cell's frames for %debug (None: GPUNB_KEEP_TRACEBACK
    # decides), its latest diagnosis, the notebook's names before the running cell (names
    # to object ids, to tell a cell's own tensors from older ones) and more exception
    # types to treat as out-of-memory errors (a library's own, tests).
    oom_keep_traceback: bool | None = None
    last_oom: OomDiagnosis | None = None
    names_before_cell: dict[str, int] | None = None
    extra_oom_types: tuple[type, ...] = ()

    def take_over(self, other: KernelState) -> None:
        """Move the sampler with its live monitors (unless this state has a sampler of its
        own) and the profiled cells of ``other`` here."""
        if self.sampler is None:
            self.sampler, other.sampler = other.sampler, None
            for monitor in other.monitors:
                monitor.kernel_state = self
                self.monitors.append(monitor)
            other.monitors.clear()
        for profile in other.profile_history.entries():
            self.profile_history.add(profile)
        other.profile_history.clear()


# The state of plain-Python use (no %load_ext gpunb on the current shell).
STANDALONE_STATE = KernelState()


def current_shell() -> Any:
    """The running IPython shell, or None; never imports IPython to find out there is none."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def kernel_state(shell: Any = None) -> KernelState:
    """The state of ``shell`` (default: the current one) when the extension is loaded on
    it, else :data:`STANDALONE_STATE`."""
    from gpunb.shells.extension import state_of

    shell = shell if shell is not None else current_shell()
    extension = state_of(shell) if shell is not None else None
    return extension.kernel if extension is not None else STANDALONE_STATE
