"""The monitor's data: columns of typed numbers in a ring (``RingColumns``: a day at 2 Hz in a
few MB) and the windows of them handed to views (``Window``, ``GpuSeries``). No thread, no NVML:
the sampler fills them."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpunb.analysis.energy.tariff import Tariff
from gpunb.analysis.monitor.traffic import EnergySoFar, LinkLimits
from gpunb.readings.nvml import NvmlStatus

_GAP_INT = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF}
# No quantity a float column holds comes near this (64 TiB is 6.7e7 MiB, a year 3.2e7 s):
# anything larger is a garbage reading, not a value to draw.
_FLOAT_MAX = 1e15


class RingColumns:
    """Columns of typed numbers sharing one write position; the oldest row is overwritten
    once ``capacity`` rows are held. Not thread-safe: the sampler locks around it."""

    def __init__(self, spec: Iterable[tuple[str, str]], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.spec = tuple(spec)
        self._arrays: dict[str, array[Any]] = {name: array(code) for name, code in self.spec}
        self._gap: dict[str, float] = {name: (math.nan if code in "fd" else _GAP_INT[code]) for name, code in self.spec}
        self._head = 0  # where the next row goes once full
        self.appended = 0  # rows ever appended

    def __len__(self) -> int:
        return min(self.appended, self.capacity)

    def _encode(self, name: str, value: Any) -> Any:
        """The stored form of ``value``; anything that is not a finite, non-negative number
        the column can hold (every column is a physical quantity) becomes a gap."""
        gap = self._gap[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return gap  # None, Unavailable, strings, odd objects
        try:
            number = float(value)
        except (OverflowError, ValueError):
            return gap
        if not math.isfinite(number) or number < 0:
            return gap
        if isinstance(gap, float):
            return number if number <= _FLOAT_MAX else gap
        whole = round(number)
        return whole if whole < gap else gap

    def append(self, row: dict[str, Any]) -> None:
        """Add one row; a value that does not fit becomes a gap, never a short column."""
        encoded = [(arr, self._encode(name, row.get(name))) for name, arr in self._arrays.items()]
        full = self.appended >= self.capacity
        for arr, value in encoded:
            if full:
                arr[self._head] = value
            else:
                arr.append(value)
        if full:
            self._head = (self._head + 1) % self.capacity
        self.appended += 1

    def add_columns(self, spec: Iterable[tuple[str, str]]) -> None:
        """New columns (a GPU found late), gaps for the rows already held."""
        for name, code in spec:
            if name in self._arrays:
                continue
            gap = math.nan if code in "fd" else _GAP_INT[code]
            self._gap[name] = gap
            self._arrays[name] = array(code, [gap]) * len(next(iter(self._arrays.values()), ()))
        self.spec = tuple((name, arr.typecode) for name, arr in self._arrays.items())

    def _ordered(self, arr: array[Any], n: int) -> array[Any]:
        if self.appended <= self.capacity:
            return arr[len(arr) - n :]
        head = self._head
        if n <= head:
            return arr[head - n : head]
        return arr[self.capacity - (n - head) :] + arr[:head]

    def tail(self, n: int | None = None, names: Iterable[str] | None = None) -> dict[str, list[Any]]:
        """The last ``n`` rows (all when None), oldest first; gaps are ``None``."""
        size = len(self)
        n = size if n is None else max(0, min(n, size))
        out = {}
        for name in names if names is not None else self._arrays:
            gap = self._gap[name]
            values = self._ordered(self._arrays[name], n)
            if isinstance(gap, float):
                out[name] = [None if v != v else v for v in values]  # NaN != NaN
            else:
                out[name] = [None if v == gap else v for v in values]
        return out

    @property
    def bytes_per_row(self) -> int:
        return sum(arr.itemsize for arr in self._arrays.values())

    @property
    def nbytes(self) -> int:
        return sum(arr.itemsize * len(arr) for arr in self._arrays.values())


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's readings over a window; ``columns`` holds GPU_COLUMNS names plus
    ``mem_other_mib`` (used by every other process: used minus this kernel's share), and the
    link columns (``pcie_rx_gbs``..., traffic.py) where they are read."""

    index: int
    name: str
    memory_total_mib: float | None
    power_limit_w: float | None
    lost: bool
    columns: dict[str, list[Any]]
    max_sm_clock_mhz: float | None = None
    temp_slowdown_c: float | None = None  # NVML's slowdown threshold: clocks drop above it
    links: LinkLimits | None = None  # the link charts' limits; None: links not read
    energy: EnergySoFar | None = None  # since the monitor's first reading; None: nothing read yet


@dataclass(frozen=True)
class Window:
    """What a view needs to draw the last ``seconds``: times, per-GPU and host series."""

    t_s: list[float]
    seconds: float
    hz: float
    gpus: tuple[GpuSeries, ...]
    host: dict[str, list[Any]]
    ram_total_mib: float | None
    cpu_count: int | None
    nvml: NvmlStatus
    notes: tuple[str, ...]
    running: bool
    gpu_count: int = 0  # all GPUs NVML sees (``gpus`` may show a subset)
    started_unix: float | None = None
    tariff: Tariff | None = None  # the user's price and carbon (empty: energy in Wh only)
    fake: tuple[str, ...] = ()  # test stand-ins answering instead of the driver (readings/test_hooks.py)
