"""What the kernel's GPUs spent since ``%load_ext gpunb`` (``%gpuenergy``): NVML's energy counter
read once in the background after the load, and again when asked.

The first reading is queued on the NVML worker (``NvmlSession.run_soon``) and never waited for
by the load itself; ``%gpuenergy`` waits for it at most the worker's budget. Where it could not
be read (NVML missing, no counter), the first ``%gpuenergy`` takes one and counts from there,
and says so. The kernel's GPUs are the ones ``CUDA_VISIBLE_DEVICES`` leaves it (all of them when
unset), as NVML numbers them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.energy.meter import CellEnergy, SummedOverGpus
from gpunb.analysis.energy.tariff import Tariff
from gpunb.analysis.machine import without_gpu
from gpunb.display import DisplayMixin
from gpunb.readings.devices import map_devices, read_identities
from gpunb.readings.energy import read_energy
from gpunb.readings.nvml import NvmlSession, PendingRun, is_available

SINCE_LOAD = "since %load_ext gpunb"
SINCE_FIRST_ASK = "since the first %gpuenergy"  # the reading at load failed: counted from the first ask
SINCE_FIRST_CALL = "since the first gpunb.energy()"  # without the extension


@dataclass(frozen=True)
class CounterSnapshot:
    """The energy counters of the kernel's GPUs at one moment."""

    t_s: float  # monotonic clock
    counters_mj: dict[int, int]  # NVML index -> millijoules since the driver loaded
    names: dict[int, str] = field(default_factory=dict)  # NVML index -> model name
    uuids: dict[int, str] = field(default_factory=dict)
    no_counter: dict[int, str] = field(default_factory=dict)  # NVML index -> why its counter is missing
    problem: str = ""  # why no GPU was read at all ("" when NVML answered)


def read_snapshot(nvml: NvmlSession, environ: Mapping[str, str] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> CounterSnapshot:
    """Every visible GPU's counter now (blocking: run it on the NVML worker)."""
    status = nvml.start()
    if not status.ok:
        return CounterSnapshot(clock(), {}, problem=without_gpu(status))
    gpus = read_identities(nvml)
    device_map = map_devices(gpus, os.environ if environ is None else environ)
    visible = sorted({d.nvml_index for d in device_map.devices if d.nvml_index is not None})
    if not visible:
        why = without_gpu(status, 0) if not gpus else "CUDA_VISIBLE_DEVICES leaves this kernel no GPU"
        return CounterSnapshot(clock(), {}, problem=why)
    by_index = {g.index: g for g in gpus}
    counters, names, uuids, missing = {}, {}, {}, {}
    for i in visible:
        g = by_index.get(i)
        names[i] = g.name if g is not None and is_available(g.name) else ""
        uuids[i] = g.uuid if g is not None and is_available(g.uuid) else ""
        value = read_energy(nvml, i).energy_mj
        if is_available(value) and isinstance(value, int):
            counters[i] = value
        else:
            missing[i] = str(getattr(value, "reason", value)) or "no energy counter"
    return CounterSnapshot(clock(), counters, names, uuids, missing)


def _unread(why: str) -> CounterSnapshot:
    return CounterSnapshot(time.monotonic(), {}, problem=f"NVML did not answer in time ({why})")


@dataclass(frozen=True)
class GpuSpent:
    index: int  # NVML's
    name: str
    uuid: str
    joules: float
    seconds: float

    @property
    def wh(self) -> float:
        return self.joules / 3600.0

    @property
    def average_w(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None


@dataclass(frozen=True)
class SessionEnergy(SummedOverGpus, DisplayMixin):
    """What the kernel's GPUs spent since the extension loaded (``%gpuenergy``, ``gpunb.energy()``)."""

    gpus: tuple[GpuSpent, ...]
    seconds: float
    since: str  # SINCE_LOAD or SINCE_FIRST_ASK
    tariff: Tariff
    tariff_source: str  # where the tariff came from ("" when none is set)
    tariff_notes: tuple[str, ...] = ()  # environment variables that could not be read
    last_cell: CellEnergy | None = None
    last_cell_name: str = ""  # "cell 12" or the profile's label
    problem: str = ""  # why there is no figure at all (no GPU, no NVML)
    no_counter: tuple[str, ...] = ()  # GPUs left out, with the reason
    just_started: bool = False  # the counting starts now: nothing to show yet

    _dict_extras = ("joules", "wh", "average_w", "cost", "co2_g")

    @property
    def cost(self) -> float | None:
        return self.tariff.cost(self.wh) if self.gpus else None

    @property
    def co2_g(self) -> float | None:
        return self.tariff.co2_g(self.wh) if self.gpus else None


def spent(start: CounterSnapshot, end: CounterSnapshot) -> tuple[tuple[GpuSpent, ...], tuple[str, ...]]:
    """Per GPU read at both ends: the counter's difference. A counter that went backwards (the
    driver was reloaded) is left out, with the reason."""
    seconds = max(0.0, end.t_s - start.t_s)
    out, left_out = [], []
    for i in sorted(set(start.counters_mj) | set(end.counters_mj) | set(end.no_counter)):
        a, b = start.counters_mj.get(i), end.counters_mj.get(i)
        if a is None or b is None:
            why = end.no_counter.get(i) or start.no_counter.get(i) or "its counter was not read at both ends"
            left_out.append(f"GPU {i}: {why}")
        elif b < a:
            left_out.append(f"GPU {i}: its energy counter went back (the NVIDIA driver was reloaded)")
        else:
            out.append(GpuSpent(i, end.names.get(i, ""), end.uuids.get(i, ""), (b - a) / 1000.0, seconds))
    return tuple(out), tuple(left_out)


class SinceLoad:
    """The kernel's first counter reading, asked for once in the background (``begin``) and
    waited for only by the first report that needs it."""

    def __init__(self, nvml_of: Callable[[], NvmlSession], environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, since: str = SINCE_LOAD) -> None:
        self._nvml_of = nvml_of  # the session is looked up when the reading is queued, not at load
        self._environ, self._clock = environ, clock
        self._pending: PendingRun[CounterSnapshot] | None = None
        self._first: CounterSnapshot | None = None
        self.since = since

    @property
    def begun(self) -> bool:
        return self._pending is not None or self._first is not None

    def begin(self) -> None:
        """Queue the first reading (idempotent, never waits)."""
        if self.begun:
            return
        nvml = self._nvml_of()
        self._pending = nvml.run_soon(read_snapshot, nvml, self._environ, self._clock, fallback=_unread,
                                      what="the energy counters")

    def first(self) -> CounterSnapshot:
        """The first reading (waiting for it if it is still on its way)."""
        return self._start()[0]

    def _start(self) -> tuple[CounterSnapshot, bool]:
        """(the first reading, whether it was taken just now)."""
        if self._first is None:
            fresh = not self.begun  # nobody asked before this report: the count starts now
            self.begin()
            assert self._pending is not None
            got = self._pending.result()
            self._pending = None
            if got.counters_mj:
                self._first = got
                return got, fresh
            else:  # nothing read: the next report starts the count
                self.since = SINCE_FIRST_ASK
                self._first = self.read_now()
                return self._first, True
        return self._first, False

    def read_now(self) -> CounterSnapshot:
        nvml = self._nvml_of()
        return nvml.run(read_snapshot, nvml, self._environ, self._clock, fallback=_unread,
                        what="the energy counters")

    def report(self, tariff: Tariff, tariff_source: str, tariff_notes: tuple[str, ...] = (),
               last_cell: CellEnergy | None = None, last_cell_name: str = "") -> SessionEnergy:
        first, fresh = self._start()
        now = first if fresh else self.read_now()
        common: dict[str, Any] = dict(tariff=tariff, tariff_source=tariff_source, tariff_notes=tariff_notes,
                                      last_cell=last_cell, last_cell_name=last_cell_name)
        if not now.counters_mj and not first.counters_mj:
            problem = now.problem or first.problem or _no_counter_words(now)
            if fresh and not problem:
                problem = _no_counter_words(now)
            return SessionEnergy((), 0.0, self.since, problem=problem, **common)
        gpus, left_out = spent(first, now)
        return SessionEnergy(gpus, max(0.0, now.t_s - first.t_s), self.since, no_counter=left_out,
                             just_started=fresh, **common)


def _no_counter_words(snapshot: CounterSnapshot) -> str:
    if snapshot.no_counter:
        whys = "; ".join(f"GPU {i}: {why}" for i, why in sorted(snapshot.no_counter.items()))
        return f"no GPU energy counter here ({whys}); NVML has one from Volta on"
    return "no GPU energy counter here"
