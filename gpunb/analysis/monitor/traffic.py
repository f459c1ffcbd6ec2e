"""What the monitor reads beside the sample: each GPU's energy counter, its PCIe throughput and its
NVLink traffic, and what it makes of them: energy since the monitor started, GB/s per link, and
the limit each link chart is drawn against.

Costs, on the sampler's NVML worker (never the kernel thread): the energy counter and the NVLink
counters of all active links are one driver call each; ``nvmlDeviceGetPcieThroughput`` measures
a 20 ms window per call (NVML's documentation), so a GPU's RX and TX cost the worker ~40 ms. The
PCIe reads therefore take turns: at most ``PCIE_READS_PER_S`` GPUs a second, so eight GPUs at
2 Hz read their PCIe every ~1.6 s while one GPU reads it every tick.

Energy since the start is the counter's difference (a driver reload that resets it is carried
over); where a GPU has no counter, the monitor's own power readings are integrated and the figure
says it is an estimate (NVML's power is a ~1 s average: 16 % under the counter on a matmul burst,
see ``analysis/energy/meter.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpunb.analysis.energy.meter import COUNTER, ESTIMATE
from gpunb.analysis.gpu_specs import pcie_gbps
from gpunb.readings.energy import PcieReading, read_energy, read_pcie
from gpunb.readings.links import GpuLinks, read_gpu_links, read_nvlink_link_bytes
from gpunb.readings.nvml import NOT_SUPPORTED, NvmlSession, Unavailable, is_available
from gpunb.readings.peak_cache import MeasuredPeaks, lookup

# Per-GPU columns the sampler adds (GB/s, 1 GB = 10^9 bytes). NVLink columns exist only for GPUs
# with active links.
PCIE_COLUMNS: tuple[tuple[str, str], ...] = (("pcie_rx_gbs", "f"), ("pcie_tx_gbs", "f"))
NVLINK_COLUMNS: tuple[tuple[str, str], ...] = (("nvlink_rx_gbs", "f"), ("nvlink_tx_gbs", "f"))
# Each PCIe throughput call measures a 20 ms window: a GPU's pair costs the NVML worker ~40 ms.
PCIE_READS_PER_S = 5.0
# The power-reading estimate bridges two readings at most this far apart: a longer gap (a stopped
# monitor) is left out rather than filled with a guess.
ESTIMATE_GAP_S = 5.0
GB = 1e9
# The limits come partly from %gpucheck's cache file: looked up again this often.
LIMITS_REFRESH_S = 30.0


@dataclass(frozen=True)
class TrafficReading:
    """One GPU's energy counter, PCIe throughput (None: not its turn) and NVLink byte counters
    (None: no active links) at ``t_s``."""

    index: int
    t_s: float
    energy_mj: Any
    pcie: PcieReading | None
    nvlink: tuple[int, int] | Unavailable | None


def read_traffic(nvml: NvmlSession, index: int, clock: Callable[[], float], links: Sequence[int],
                 pcie: bool) -> TrafficReading:
    """Runs on the NVML worker (one ``nvml.run``): the counter, the NVLink counters, the PCIe pair."""
    energy = read_energy(nvml, index, clock)
    nvlink = read_nvlink_link_bytes(nvml, index, links) if links else None
    reading = read_pcie(nvml, index, clock) if pcie else None
    return TrafficReading(index, energy.t_s, energy.energy_mj, reading, nvlink)


def counted_links(nvml: NvmlSession, infos: Sequence[Any]) -> dict[int, GpuLinks]:
    """Each GPU's NVLink facts (``infos``: GpuInfo), read once when the GPUs are found (never per
    tick). A GPU whose active links have no traffic counters (NVML: NOT_SUPPORTED) counts as
    having none: its NVLink chart is hidden rather than drawn empty."""
    out = {}
    for info in infos:
        if info.lost:
            continue
        links = read_gpu_links(nvml, info.index, info.pci_bus_id)
        if links.active:
            probe = read_nvlink_link_bytes(nvml, info.index, [p.link for p in links.active])
            if isinstance(probe, Unavailable) and probe.code == NOT_SUPPORTED:
                links = GpuLinks(info.index, info.pci_bus_id, links.link_count, (), links.link_speed_mbps,
                                 "NVLink traffic counters not supported")
        out[info.index] = links
    return out


@dataclass(frozen=True)
class LinkLimit:
    """The most a link direction carries: what ``%gpucheck`` measured, else the datasheet's figure."""

    gbs: float | None
    source: str  # in words, for the chart's tooltip
    measured: bool = False

    @property
    def words(self) -> str:
        return "measured peak" if self.measured else "datasheet peak"


@dataclass(frozen=True)
class LinkLimits:
    pcie_rx: LinkLimit  # host -> GPU
    pcie_tx: LinkLimit  # GPU -> host
    nvlink: LinkLimit | None = None  # one direction; None: no active NVLink (its chart is hidden)
    nvlink_links: int = 0


def link_limits(info: Any, links: GpuLinks | None, measured: MeasuredPeaks | None) -> LinkLimits:
    """The limits of GPU ``info``'s charts (``info`` a ``GpuInfo``): PCIe from the copy bandwidth
    ``%gpucheck`` measured (pinned host memory), else PCI-SIG's rate for the link's generation and
    width; NVLink from NVML's per-link speed times the active links."""
    gen, width = info.pcie_gen_max, info.pcie_width_max
    sheet = pcie_gbps(gen, width) if is_available(gen) and is_available(width) and gen and width else None
    sheet_limit = LinkLimit(sheet, f"datasheet: PCIe gen{gen} x{width}, one direction" if sheet else
                            "no PCIe peak known (NVML did not give the link's generation and width)")

    def pcie(key: str, words: str) -> LinkLimit:
        gbs = measured.copy_gbps.get(key) if measured is not None else None
        if gbs:
            return LinkLimit(gbs, f"{words} copies of pinned memory measured by {measured.source()}",  # type: ignore[union-attr]
                             measured=True)
        return sheet_limit

    nvlink = None
    active = len(links.active) if links is not None else 0
    if active:
        speed = links.link_speed_mbps if links is not None else None
        nvlink = LinkLimit(active * speed / 1000.0 if speed else None,
                           f"NVML: {active} links × {speed / 1000:.1f} GB/s, one direction" if speed else
                           f"{active} active links; NVML did not give their speed")
    return LinkLimits(pcie("h2d", "host→GPU"), pcie("d2h", "GPU→host"), nvlink, active)


@dataclass(frozen=True)
class EnergySoFar:
    """One GPU's energy from ``since_s`` to ``until_s`` (the sampler's ``t_s``)."""

    index: int
    joules: float
    since_s: float
    until_s: float
    source: str  # COUNTER or ESTIMATE

    @property
    def wh(self) -> float:
        return self.joules / 3600.0

    @property
    def estimated(self) -> bool:
        return self.source == ESTIMATE


class _GpuEnergy:
    __slots__ = ("base_mj", "carried_j", "estimate_j", "last_mj", "power", "since", "source", "until")

    def __init__(self) -> None:
        self.source: str | None = None
        self.base_mj = self.last_mj = 0
        self.carried_j = self.estimate_j = 0.0
        self.since = self.until = 0.0
        self.power: tuple[float, float] | None = None  # (t_s, W) of the last power reading

    def add(self, t: float, energy_mj: Any, power_w: Any) -> None:
        counter = isinstance(energy_mj, int) and not isinstance(energy_mj, bool) and energy_mj >= 0
        if self.source is None:
            if counter:
                self.source, self.base_mj, self.last_mj, self.since, self.until = COUNTER, energy_mj, energy_mj, t, t
            elif isinstance(power_w, (int, float)) and power_w >= 0:
                self.source, self.since, self.until, self.power = ESTIMATE, t, t, (t, float(power_w))
            return
        if self.source == COUNTER:
            if not counter:
                return  # missing now: the next reading's difference covers the gap
            if energy_mj < self.last_mj:  # the driver reloaded: its counter starts again
                self.carried_j += (self.last_mj - self.base_mj) / 1000.0
                self.base_mj = energy_mj
            self.last_mj, self.until = energy_mj, t
            return
        if not isinstance(power_w, (int, float)) or power_w < 0:
            return
        if self.power is not None and 0 < t - self.power[0] <= ESTIMATE_GAP_S:
            self.estimate_j += (self.power[1] + power_w) / 2 * (t - self.power[0])
            self.until = t
        self.power = (t, float(power_w))

    def so_far(self, index: int) -> EnergySoFar | None:
        if self.source is None:
            return None
        joules = self.carried_j + (self.last_mj - self.base_mj) / 1000.0 if self.source == COUNTER else self.estimate_j
        return EnergySoFar(index, joules, self.since, self.until, self.source)


class EnergyTally:
    """Energy since the first reading, per GPU. Not thread-safe: the sampler's tick feeds it."""

    def __init__(self) -> None:
        self._gpus: dict[int, _GpuEnergy] = {}

    def add(self, index: int, t_s: float, energy_mj: Any, power_w: Any) -> None:
        self._gpus.setdefault(index, _GpuEnergy()).add(t_s, energy_mj, power_w)

    def so_far(self, index: int) -> EnergySoFar | None:
        gpu = self._gpus.get(index)
        return gpu.so_far(index) if gpu is not None else None


class NvlinkRates:
    """GB/s from NVLink's running byte counters: the difference of two readings over their time."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, int, int]] = {}

    def rate(self, index: int, t_s: float, counters: Any) -> tuple[float | None, float | None]:
        """(received, sent) GB/s since the previous reading; None at the first or after a gap."""
        if not isinstance(counters, tuple):
            self._last.pop(index, None)
            return None, None
        tx, rx = counters
        last = self._last.get(index)
        self._last[index] = (t_s, tx, rx)
        if last is None or t_s <= last[0] or tx < last[1] or rx < last[2]:
            return None, None
        dt = t_s - last[0]
        return (rx - last[2]) / dt / GB, (tx - last[1]) / dt / GB


class PcieTurns:
    """Which GPUs read their PCIe throughput this tick: a credit of PCIE_READS_PER_S a second, the
    GPUs in turn, so the worker's 40 ms per GPU never piles up in one tick."""

    def __init__(self) -> None:
        self._credit = 0.0
        self._next = 0

    def due(self, indices: Sequence[int], hz: float) -> set[int]:
        if not indices:
            return set()
        self._credit = min(float(len(indices)), self._credit + PCIE_READS_PER_S / hz)
        n = int(self._credit)
        self._credit -= n
        out = {indices[(self._next + k) % len(indices)] for k in range(min(n, len(indices)))}
        self._next = (self._next + n) % len(indices)
        return out


def gbs(value: Any) -> float | None:
    """bytes/s (or Unavailable) -> GB/s."""
    return value / GB if is_available(value) and isinstance(value, (int, float)) else None


def _none(_why: str) -> None:
    return None


class TrafficReader:
    """The sampler's part for energy and links: one ``nvml.run`` per GPU and tick on the NVML worker,
    the energy tally, NVLink rates, PCIe turns, and a note when a reading goes missing or comes back."""

    def __init__(self, nvml: NvmlSession, clock: Callable[[], float], *, grace_s: float) -> None:
        self.nvml, self._clock, self._grace_s = nvml, clock, grace_s
        self.links: dict[int, GpuLinks] = {}  # NVLink facts per GPU (read once, with the GPUs)
        self._energy = EnergyTally()
        self._nvlink = NvlinkRates()
        self._turns = PcieTurns()
        self._due: set[int] = set()
        self._faults: set[tuple[int, str]] = set()
        self._worked: set[tuple[int, str]] = set()  # readings that answered at least once
        self._limits: tuple[float, dict[int, LinkLimits]] | None = None

    def set_links(self, links: dict[int, GpuLinks]) -> None:
        self.links, self._limits = dict(links), None

    def active_links(self, index: int) -> tuple[int, ...]:
        links = self.links.get(index)
        return tuple(p.link for p in links.active) if links is not None else ()

    def plan(self, indices: Sequence[int], hz: float) -> None:
        """At the start of a tick: which GPUs read PCIe in it."""
        self._due = self._turns.due(indices, hz)

    def read(self, index: int, row: dict[str, Any], power_w: float | None, origin: float) -> list[str]:
        """Read GPU ``index`` into ``row`` (the sampler's row; ``origin`` its time zero); returns
        the notes to add (a reading gone missing, or back)."""
        active = self.active_links(index)
        pcie = index in self._due
        got = self.nvml.run(read_traffic, self.nvml, index, self._clock, active, pcie, grace_s=self._grace_s,
                            fallback=_none, what="energy and link traffic")
        if got is None:  # the tick's budget was spent: the counter's next reading covers the gap
            return []
        t = got.t_s - origin
        self._energy.add(index, t, got.energy_mj, power_w)
        so_far = self._energy.so_far(index)
        missing: dict[str, str] = {}
        if not is_available(got.energy_mj) and so_far is not None:
            missing["energy counter"] = (
                f"GPU {index} energy counter: {got.energy_mj} — energy since the start is estimated from the "
                "power readings." if so_far.estimated else
                f"GPU {index} energy counter: {got.energy_mj} — energy since the start counts to the last "
                "reading until the counter is back.")
        col = f"gpu{index}_"
        if got.pcie is not None:
            row[col + "pcie_rx_gbs"], row[col + "pcie_tx_gbs"] = gbs(got.pcie.rx_bytes_s), gbs(got.pcie.tx_bytes_s)
            if not is_available(got.pcie.rx_bytes_s):
                missing["PCIe throughput"] = f"GPU {index} PCIe throughput: {got.pcie.rx_bytes_s} — shown as a gap."
        if active:
            row[col + "nvlink_rx_gbs"], row[col + "nvlink_tx_gbs"] = self._nvlink.rate(index, t, got.nvlink)
            if not isinstance(got.nvlink, tuple):
                missing["NVLink traffic"] = f"GPU {index} NVLink traffic: {got.nvlink} — shown as a gap."
        checked = {"energy counter", "NVLink traffic"} | ({"PCIe throughput"} if pcie else set())
        self._worked.update((index, what) for what in checked if what not in missing)
        # A reading this GPU never had (NOT_SUPPORTED from the start) is no news: its chart says
        # "no reading" and the energy line "estimated". One that stops, or fails otherwise, is.
        missing = {what: text for what, text in missing.items()
                   if (index, what) in self._worked or "not supported" not in text}
        notes = [text for what, text in missing.items() if (index, what) not in self._faults]
        for key in [k for k in self._faults if k[0] == index and k[1] in checked and k[1] not in missing]:
            notes.append(f"GPU {index} {key[1]} readings are back.")
            self._faults.discard(key)
        self._faults.update((index, what) for what in missing)
        return notes

    def energy(self, index: int) -> EnergySoFar | None:
        return self._energy.so_far(index)

    def limits(self, gpus: Sequence[Any]) -> dict[int, LinkLimits]:
        """Each GPU's link limits (``gpus``: GpuInfo); the measured peaks are looked up in
        %gpucheck's cache at most every LIMITS_REFRESH_S (a check may run while a monitor shows)."""
        cached = self._limits
        now = time.monotonic()
        if cached is not None and now - cached[0] < LIMITS_REFRESH_S and set(cached[1]) == {g.index for g in gpus}:
            return cached[1]
        out = {}
        for info in gpus:
            uuid = info.uuid if is_available(info.uuid) else None
            out[info.index] = link_limits(info, self.links.get(info.index), lookup(str(uuid)) if uuid else None)
        self._limits = (now, out)
        return out
