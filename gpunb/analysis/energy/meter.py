"""What a profiled cell's GPUs spent: joules per GPU and in all, per step and per sample.

The cell's energy is NVML's energy counter read at the cell's start and end. Per step it is
a *window's* energy divided by the steps inside it (the counter changes ~10 times a second on
an H200, so one short step has no reading of its own): the meter reads the counter in the
background at the step marks, at most every ``MARK_EVERY_S``, and the steady window runs from
the first reading after the warm-up steps to the last one. A window under ``MIN_WINDOW_S`` is
not trusted for a per-step figure. Where the counter is missing, NVML's power samples are
integrated instead, and the record says it is an estimate.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpunb.readings.energy import PowerSamples, read_energy, read_power_since
from gpunb.readings.gpu_activity import now_us
from gpunb.readings.nvml import NvmlSession, PendingRun, is_available

MARK_EVERY_S = 0.25  # a counter reading at a step mark at most this often (it moves every ~0.1 s)
MIN_WINDOW_S = 1.0  # a per-step energy needs a steady window at least this long
# A mark's reading is taken just after the counter moves (it moves every ~0.09 s on an H200), on the
# NVML worker: a reading taken at any moment is up to one move stale (~60 J at 700 W, 9 % of a 1 s
# window), one taken as it moves is not. The worker polls at most this long; the step never waits.
FRESH_WAIT_S = 0.15
# Between two reads the worker sleeps (no GIL held): ~6 reads per mark on average. The move is dated
# halfway between the last read before it and the first after: within 4 ms, 0.4 % of a 1 s window.
# On the H200 the meter cost a launch-bound loop +2.4 to +3.0 % whether marks came every 0.25 or
# 0.5 s, polled every 8 or 20 ms, PCIe every 0.5 or 2 s (docs/profile-energy.md): not the polling.
FRESH_POLL_S = 0.008
COUNTER = "energy counter"
ESTIMATE = "power samples (estimate)"
# How far the estimate was off, measured: 3 s of bf16 matmuls on an H200, 2026-12-01.
ESTIMATE_NOTE = "NVML's ~1 s power averages integrated; 16 % under the counter on a matmul burst (H200)"


@dataclass(frozen=True)
class GpuEnergy:
    index: int  # NVML's
    joules: float
    seconds: float
    source: str  # COUNTER or ESTIMATE

    @property
    def average_w(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None


class _GpuJoules(Protocol):
    @property
    def joules(self) -> float: ...


class SummedOverGpus:
    """The totals of an energy record: its ``gpus``' joules over its ``seconds``."""

    gpus: Sequence[_GpuJoules]  # GpuEnergy, GpuSpent
    seconds: float

    @property
    def joules(self) -> float:
        return sum(g.joules for g in self.gpus)

    @property
    def wh(self) -> float:
        return self.joules / 3600.0

    @property
    def average_w(self) -> float | None:
        return self.joules / self.seconds if self.gpus and self.seconds > 0 else None


@dataclass(frozen=True)
class CellEnergy(SummedOverGpus):
    """The energy of one profiled cell, summed over its GPUs."""

    gpus: tuple[GpuEnergy, ...]
    seconds: float
    step_joules: float | None = None  # per step, over the steady window
    window_steps: int = 0
    window_s: float | None = None
    batch_size: int | None = None
    idle_share: float | None = None  # share of the cell's energy spent while no kernel ran (estimate)
    note: str = ""
    window_step_joules: tuple[float, ...] = ()  # per step in each consecutive window of >= MIN_WINDOW_S
    tokens_per_sample: int | None = None  # the batch's sequence length (detected or given)
    window_step_s: tuple[float, ...] = ()  # seconds per step in the same windows

    @property
    def step_spread(self) -> float | None:
        """(max - min) / median of the per-step energy over the steady windows; None under two."""
        return _spread(self.window_step_joules)

    @property
    def step_time_spread(self) -> float | None:
        """The same spread of the time per step in those windows (an unsteady loop's share of the above)."""
        return _spread(self.window_step_s)

    @property
    def sample_joules(self) -> float | None:
        if self.step_joules is None or not self.batch_size:
            return None
        return self.step_joules / self.batch_size

    @property
    def samples_per_joule(self) -> float | None:
        per = self.sample_joules
        return 1.0 / per if per else None

    @property
    def tokens_per_joule(self) -> float | None:
        per = self.samples_per_joule
        return per * self.tokens_per_sample if per and self.tokens_per_sample else None

    @property
    def estimated(self) -> bool:
        return any(g.source == ESTIMATE for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """The fields and the figures derived from them, as plain data."""
        out = dataclasses.asdict(self)
        for name in ("joules", "wh", "average_w", "sample_joules", "samples_per_joule", "tokens_per_joule",
                     "step_spread", "step_time_spread", "estimated"):
            out[name] = getattr(self, name)
        return out


def _spread(values: Sequence[float]) -> float | None:
    w = sorted(values)
    if len(w) < 2 or w[len(w) // 2] <= 0:
        return None
    return (w[-1] - w[0]) / w[len(w) // 2]


@dataclass(frozen=True)
class Mark:
    """The counters (mJ per NVML index) when ``steps`` steps had ended, ``t_s`` into the cell."""

    t_s: float
    steps: int
    energy_mj: dict[int, int]


def read_counters(nvml: NvmlSession, indices: Sequence[int] | None) -> dict[int, int]:
    """The energy counters (mJ since the driver loaded) of ``indices``; GPUs without one are left out."""
    out = {}
    for i in range(nvml.device_count()) if indices is None else indices:  # None: every GPU NVML sees
        value = read_energy(nvml, i).energy_mj
        if is_available(value) and isinstance(value, int):
            out[i] = value
    return out


def _none(_why: str) -> dict[int, int]:
    return {}


def _read_marked(nvml: NvmlSession, indices: Sequence[int] | None, fresh: int | None,
                 clock: Callable[[], float], stop: threading.Event) -> tuple[float | None, dict[int, int]]:
    """(when, counters) with the counters read just after GPU ``fresh``'s counter moved, ``when``
    on ``clock``; (None, counters read now) without ``fresh`` or when it did not move in
    FRESH_WAIT_S (an idle GPU, a frozen test clock). ``stop`` ends the wait at once (the cell
    ended: its end readings must not queue behind this one)."""
    first = read_counters(nvml, indices)
    if fresh is None or fresh not in first:
        return None, first
    give_up = time.monotonic() + FRESH_WAIT_S
    unchanged_at = clock()  # when the counter last read as it was
    while time.monotonic() < give_up and not stop.is_set():
        time.sleep(FRESH_POLL_S)
        value = read_energy(nvml, fresh).energy_mj
        now = clock()
        if isinstance(value, int) and is_available(value) and value != first[fresh]:
            out = read_counters(nvml, [i for i in first if i != fresh])
            out[fresh] = value
            return (unchanged_at + now) / 2, out
        unchanged_at = now
    return None, first


def _none_marked(_why: str) -> tuple[float | None, dict[int, int]]:
    return None, {}


def steady_step_joules(marks: Sequence[Mark], warmup_steps: int) -> tuple[float | None, int, float | None]:
    """(joules per step, steps in the window, window seconds) between the first mark after the
    warm-up and the last mark, summed over the GPUs both marks read; None under MIN_WINDOW_S."""
    usable = [m for m in marks if m.steps >= max(1, warmup_steps) and m.energy_mj]
    if len(usable) < 2:
        return None, 0, None
    first, last = usable[0], usable[-1]
    steps, seconds = last.steps - first.steps, last.t_s - first.t_s
    both = set(first.energy_mj) & set(last.energy_mj)
    if steps <= 0 or seconds < MIN_WINDOW_S or not both:
        return None, steps, seconds
    joules = sum(last.energy_mj[i] - first.energy_mj[i] for i in both) / 1000.0
    return (joules / steps if joules >= 0 else None), steps, seconds


def _windows(marks: Sequence[Mark], warmup_steps: int) -> list[tuple[Mark, Mark, set[int]]]:
    """(first, last, GPUs read at both) of consecutive windows of at least MIN_WINDOW_S after the warm-up."""
    usable = [m for m in marks if m.steps >= max(1, warmup_steps) and m.energy_mj]
    out = []
    edge = usable[0] if usable else None
    for m in usable[1:]:
        assert edge is not None
        both = set(edge.energy_mj) & set(m.energy_mj)
        if m.t_s - edge.t_s >= MIN_WINDOW_S and m.steps > edge.steps and both:
            out.append((edge, m, both))
            edge = m
    return out


def window_step_joules(marks: Sequence[Mark], warmup_steps: int) -> tuple[float, ...]:
    """Joules per step in each window (``_windows``): how steady the per-step figure is."""
    return tuple(sum(b.energy_mj[i] - a.energy_mj[i] for i in both) / 1000.0 / (b.steps - a.steps)
                 for a, b, both in _windows(marks, warmup_steps))


def window_step_seconds(marks: Sequence[Mark], warmup_steps: int) -> tuple[float, ...]:
    """Seconds per step in the same windows: a loop whose steps speed up and slow down spends
    more or less idle energy per step, which the joules' spread then shows too."""
    return tuple((b.t_s - a.t_s) / (b.steps - a.steps) for a, b, _ in _windows(marks, warmup_steps))


class EnergyMeter:
    """Reads the cell's GPUs' energy counters at its start, at step marks (in the background:
    a step never waits for NVML) and at its end."""

    def __init__(self, nvml: NvmlSession, indices: Sequence[int] | None,
                 clock: Callable[[], float] = time.monotonic, fresh: int | None = None) -> None:
        # indices None: every GPU (a cell that starts CUDA, or starts ranks, names its GPUs only at its end);
        # fresh: the GPU whose counter's moves the step marks are taken at (FRESH_WAIT_S), None: any time
        self.nvml, self.clock, self.fresh = nvml, clock, fresh
        self._ending = threading.Event()  # set at the end: a mark still waiting for the counter gives up
        self.indices = tuple(indices) if indices is not None else None
        self.t0, self.t0_us = clock(), now_us()
        self._start: PendingRun[dict[int, int]] = nvml.run_soon(read_counters, nvml, self.indices, fallback=_none,
                                                                 what="the energy counters")
        self.marks: list[Mark] = []
        self._pending: tuple[float, int, PendingRun[tuple[float | None, dict[int, int]]]] | None = None
        self._asked_at = -1.0

    def at_step(self, steps: int) -> None:
        """A step mark: keep the reading that came back, ask for the next one (never waits)."""
        now = self.clock() - self.t0
        pending = self._pending
        if pending is not None and pending[2].ready():
            self._keep(pending, now, steps)
            pending = self._pending = None
        if pending is None and now - self._asked_at >= MARK_EVERY_S:
            self._asked_at = now
            self._pending = (now, steps, self.nvml.run_soon(_read_marked, self.nvml, self.indices, self.fresh,
                                                            self.clock, self._ending, fallback=_none_marked,
                                                            budget_s=self.nvml.call_timeout_s,
                                                            what="the energy counters"))

    def _keep(self, pending: tuple[float, int, PendingRun[tuple[float | None, dict[int, int]]]],
              seen_s: float, steps_seen: int) -> None:
        """A reading taken when asked is marked with the steps then; a fresh one (taken as the
        counter moved, between asking and seeing it back) with its own time and the steps
        interpolated between those two moments (within half a step)."""
        asked_s, asked_steps, run = pending
        when, counters = run.result()
        if when is None:
            self.marks.append(Mark(asked_s, asked_steps, counters))
            return
        t_s = when - self.t0
        share = (t_s - asked_s) / (seen_s - asked_s) if seen_s > asked_s else 1.0
        steps = asked_steps + (steps_seen - asked_steps) * min(1.0, max(0.0, share))
        self.marks.append(Mark(t_s, round(steps), counters))

    def finish(self, *, warmup_steps: int = 1, batch_size: int | None = None,
               idle_time_share: float | None = None, indices: Sequence[int] | None = None,
               steps_at: Callable[[float], int] | None = None) -> CellEnergy | None:
        """The cell's energy on ``indices`` (default: the meter's GPUs); None when no GPU gave a
        counter or power samples. ``steps_at(t_s)``: the steps the GPU had finished ``t_s`` into
        the meter's time (from the steps' CUDA events), which replace the steps the host had
        queued at each mark: the host runs up to a launch queue ahead of the GPU, and the
        counter counts what the GPU did."""
        seconds = self.clock() - self.t0
        self._ending.set()
        pending, self._pending = self._pending, None
        if pending is not None and self.fresh is None:  # the last mark, read when asked: kept
            self._keep(pending, pending[0], pending[1])  # (a fresh one is dropped: the end never waits for it)
        start = self._start.result()
        used = tuple(indices) if indices is not None else self.indices if self.indices is not None else tuple(start)
        if indices is not None:  # only the GPUs the cell used count, at every mark
            self.marks = [dataclasses.replace(m, energy_mj={i: v for i, v in m.energy_mj.items() if i in used})
                          for m in self.marks]
        if steps_at is not None:
            self.marks = [dataclasses.replace(m, steps=steps_at(m.t_s)) for m in self.marks]
        end = read_counters(self.nvml, used)
        end_us = now_us()
        gpus = []
        powers: dict[int, PowerSamples] = {}
        for i in used:
            if i in start and i in end and end[i] >= start[i]:
                gpus.append(GpuEnergy(i, (end[i] - start[i]) / 1000.0, seconds, COUNTER))
                continue
            samples = read_power_since(self.nvml, i, self.t0_us - 2_000_000)
            joules = samples.joules(self.t0_us, end_us) if isinstance(samples, PowerSamples) else None
            if joules is not None and isinstance(samples, PowerSamples):
                powers[i] = samples
                gpus.append(GpuEnergy(i, joules, seconds, ESTIMATE))
        if not gpus:
            return None
        step_j, window_steps, window_s = steady_step_joules(self.marks, warmup_steps)
        note = ESTIMATE_NOTE if powers else ""
        if step_j is None and window_s is not None and window_s < MIN_WINDOW_S:
            note = "; ".join(filter(None, [note, f"the steady steps lasted {window_s:.1f} s: too short for "
                                                 f"a per-step energy (it needs {MIN_WINDOW_S:.0f} s)"]))
        cell = CellEnergy(tuple(gpus), seconds, step_j, window_steps, window_s, batch_size, None, note,
                          window_step_joules(self.marks, warmup_steps),
                          window_step_s=window_step_seconds(self.marks, warmup_steps))
        return _with_idle_share(cell, idle_time_share, self.nvml, self.t0_us, end_us)


def _with_idle_share(cell: CellEnergy, idle_time_share: float | None, nvml: NvmlSession, start_us: int,
                     end_us: int) -> CellEnergy:
    """The share of the energy spent while no kernel ran: the idle time (NVML's utilization
    samples at 0 %) at the lowest power NVML saw in the cell, over the cell's energy. An
    estimate; left out without both readings."""
    if idle_time_share is None or not cell.joules or len(cell.gpus) != 1:
        return cell
    samples = read_power_since(nvml, cell.gpus[0].index, start_us)
    if not isinstance(samples, PowerSamples):
        return cell
    inside = [w for t, w in samples.points if start_us <= t <= end_us]
    if not inside:
        return cell
    idle_j = idle_time_share * cell.seconds * min(inside)
    share = max(0.0, min(1.0, idle_j / cell.joules))
    return dataclasses.replace(cell, idle_share=share)
