"""Each kernel's share of a GPU's energy while it holds that GPU, for the server extension.

Between two reports, a GPU's energy is its NVML counter's difference. It goes to the holders
NVML listed on that GPU in *both* reports (a kernel and its children count as one holder),
split equally among them: NVML's counter is per GPU, not per process, and an equal split
needs no reading beyond the process list the report already has. A holder that appeared or
left between the two reports gets nothing of that interval; so does energy spent while no
process held the GPU. The finer the reports (Prometheus' scrape interval, the monitors asking
the server), the closer the split follows who held the GPU when.

While a kernel was idle (execution state ``idle``) in both reports, its share also counts
toward its current idle stretch, which starts again when the kernel runs code: the
"lesson3.ipynb held GPU 1 idle for 40 min: 70 Wh" line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpunb.analysis.holders.gpus import KERNEL, KERNEL_CHILD, GpuHolder, HoldersReport, duration_words
from gpunb.units import energy as energy_words

IDLE = "idle"
Owner = tuple[str, object]  # ("kernel", kernel_id) or ("pid", pid)


@dataclass
class _Share:
    joules: float = 0.0
    idle_joules: float = 0.0
    idle_s: float = 0.0
    shared_with: str = ""  # who else the last interval's energy was split with, in words


def _who(h: GpuHolder) -> str:
    """A holder in a few words: whose process it is (another user can move a kernel's share)."""
    if h.kind in (KERNEL, KERNEL_CHILD) and h.kernel_id:
        return f"kernel {h.kernel_id[:8]}" + (f" ({h.path})" if h.path else "")
    what = h.script or h.process_name or "a process"
    return f"{h.username}'s {what} (PID {h.pid})" if h.username else f"{what} (PID {h.pid}, user not visible)"


def _shared_with(me: Owner, owners: set[Owner], rows: dict[Owner, GpuHolder]) -> str:
    others = sorted(_who(rows[o]) for o in owners if o != me and o in rows)
    if not others:
        return ""
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return f"split equally with {len(others)} other process{'es' if len(others) > 1 else ''} on this GPU: {shown}"


def _owner(h: GpuHolder) -> Owner:
    return ("kernel", h.kernel_id) if h.kind in (KERNEL, KERNEL_CHILD) and h.kernel_id else ("pid", h.pid)


def _owners(report: HoldersReport) -> dict[int, set[Owner]]:
    return {d.index: {_owner(h) for h in d.holders} for d in report.devices}


class KernelEnergyLedger:
    """Keeps each (kernel, GPU) share across reports; :meth:`account` adds one report's interval.
    Not thread-safe: the server calls it from its one NVML thread."""

    def __init__(self) -> None:
        self._last: HoldersReport | None = None
        self._shares: dict[tuple[str, int], _Share] = {}

    def account(self, report: HoldersReport) -> HoldersReport:
        """``report`` with each kernel's energy on its first holder row per GPU."""
        last, self._last = self._last, report
        states = {u.kernel.kernel_id: u.kernel.execution_state for u in report.kernels}
        if last is not None:
            self._add_interval(last, report, states)
        live = set(states)
        self._shares = {key: share for key, share in self._shares.items() if key[0] in live}  # gone kernels
        return self._marked(report)

    def _add_interval(self, last: HoldersReport, now: HoldersReport, states: dict[str, str]) -> None:
        dt = now.t_unix - last.t_unix
        before_states = {u.kernel.kernel_id: u.kernel.execution_state for u in last.kernels}
        counters = {d.index: d.energy_mj for d in last.devices}
        before = _owners(last)
        for d in now.devices:
            start = counters.get(d.index)
            if start is None or d.energy_mj is None or d.energy_mj < start or dt <= 0:
                continue  # no counter, or the driver was reloaded: nothing to split
            both = before.get(d.index, set()) & {_owner(h) for h in d.holders}
            if not both:
                continue
            each = (d.energy_mj - start) / 1000.0 / len(both)
            rows = {_owner(h): h for h in reversed(d.holders)}  # an owner's first row names it
            for kind, who in both:
                if kind != "kernel":
                    continue
                kernel_id = str(who)
                share = self._shares.setdefault((kernel_id, d.index), _Share())
                share.joules += each
                share.shared_with = _shared_with((kind, who), both, rows)
                if states.get(kernel_id) == IDLE and before_states.get(kernel_id) == IDLE:
                    share.idle_joules += each
                    share.idle_s += dt
                else:
                    share.idle_joules, share.idle_s = 0.0, 0.0

    def _marked(self, report: HoldersReport) -> HoldersReport:
        devices = []
        for d in report.devices:
            seen: set[str] = set()
            rows = []
            for h in d.holders:
                share = self._shares.get((h.kernel_id, d.index)) if h.kind in (KERNEL, KERNEL_CHILD) else None
                if share is not None and h.kernel_id not in seen:
                    seen.add(h.kernel_id)
                    h = dataclasses.replace(h, energy_j=share.joules, idle_energy_j=share.idle_joules or None,
                                            idle_measured_s=share.idle_s or None, energy_shared_with=share.shared_with)
                rows.append(h)
            devices.append(dataclasses.replace(d, holders=tuple(rows)) if seen else d)
        return dataclasses.replace(report, devices=tuple(devices))


def idle_energy_line(h: GpuHolder, now_unix: float) -> str:
    """``lesson3.ipynb held GPU 1 idle for 40 min: 70 Wh`` for a kernel's row with idle energy;
    "" for any other. The duration is the kernel's idle time; where gpunb measured less of it
    (the server started later), the line says how much."""
    if h.idle_energy_j is None or h.execution_state != IDLE or h.kind not in (KERNEL, KERNEL_CHILD):
        return ""
    who = h.path or f"kernel {h.kernel_id[:8]}"
    idle_s = max(0.0, now_unix - h.last_activity_unix) if h.last_activity_unix is not None else None
    measured = h.idle_measured_s or 0.0
    if idle_s is None or measured < 0.9 * idle_s:
        span = f"{duration_words(measured)} measured" if idle_s is None else \
            f"{duration_words(idle_s)}, {duration_words(measured)} of it measured"
    else:
        span = duration_words(idle_s)
    share = f" (its share of a GPU others also use: {h.energy_shared_with})" if h.energy_shared_with else ""
    return f"{who} held GPU {h.gpu_index} idle for {span}: {energy_words(h.idle_energy_j)}{share}"
