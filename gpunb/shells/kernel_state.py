"""Everything gpunb keeps for one kernel, in one typed object.

The extension owns one :class:`KernelState` per IPython shell (made by ``%load_ext``,
emptied by ``%unload_ext``; ``gpunb.shells.extension.kernel_state(shell)`` finds it).
Without the extension (``import gpunb`` in plain Python or in a notebook that did not
load it) the API twins use :data:`STANDALONE_STATE`. On load
the extension takes over what the standalone state already holds (a monitor started by
``gpunb.monitor()``, cells profiled by ``gpunb.profile()``); on unload the profiled cells
go back to it, so ``%reload_ext gpunb`` keeps the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpunb.analysis.profile.history import ProfileHistory

if TYPE_CHECKING:  # only for the annotations: importing these costs %load_ext time
    from gpunb.analysis.energy.since_load import SinceLoad
    from gpunb.analysis.memory.oom_records import OomDiagnosis
    from gpunb.analysis.monitor.sampler import Sampler
    from gpunb.analysis.profile.meter import CellMeter
    from gpunb.readings.alloc_history import HistoryRecording


class LiveMonitor(Protocol):
    """What the state asks of a monitor (``gpunb.shells.monitor.Monitor``, which imports
    this module, so it is described here rather than imported)."""

    kernel_state: KernelState  # the state whose ``monitors`` list holds it
    requested_hz: float | None  # the rate it asked for (or joined at): the sampler serves the fastest

    def stop(self) -> None: ...


@dataclass(eq=False)
class KernelState:
    # %gpumonitor / gpunb.monitor(): the kernel's one sampler thread (None until the first
    # monitor) and the monitors drawing from it.
    sampler: Sampler | None = None
    monitors: list[LiveMonitor] = field(default_factory=list)
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
    # %gpuenergy / gpunb.energy(): the energy counters read after %load_ext (None until asked).
    energy_since_load: SinceLoad | None = None
    # %gpumem --trace on: torch's allocation history, armed for the OOM doctor's stacks
    # (None while off; %unload_ext switches it off).
    alloc_history: HistoryRecording | None = None

    def take_over(self, other: KernelState) -> None:
        """Move the sampler with its live monitors (unless this state has a sampler of its
        own) and the profiled cells of ``other`` here."""
        if self.sampler is None:
            self.sampler, other.sampler = other.sampler, None
            for monitor in other.monitors:
                monitor.kernel_state = self
                self.monitors.append(monitor)
            other.monitors.clear()
        self.profile_history.take_from(other.profile_history)


# The state of plain-Python use (no %load_ext gpunb on the current shell).
STANDALONE_STATE = KernelState()

