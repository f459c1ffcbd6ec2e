"""The sampler: one thread per kernel reading every GPU and the host a few times a second.

It keeps the readings in bounded ring buffers of compact typed numbers (``array``), so
a day at the default 2 Hz fits in a few MB, and hands out windows of them to whoever
listens (the ``%gpumonitor`` output). The thread never prints: it only calls listeners.
NVML faults (a sensor not supported, a GPU fallen off the bus) become gaps plus a note;
nothing that happens in a tick stops the thread.

``tick()`` is the seam tests (and the benchmarks) drive without a thread; the clock is
injectable so replayed traces line up.

Over 500 lines on purpose: :class:`Sampler` is one thread's whole life (start, tick, rediscover,
stop) around one lock; its data structures are in ``series.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.energy.tariff import session_tariff
from gpunb.analysis.monitor.imbalance import WINDOW_S as IMBALANCE_WINDOW_S
from gpunb.analysis.monitor.imbalance import Imbalance, find_imbalance
from gpunb.analysis.monitor.series import GpuSeries, RingColumns, Window
from gpunb.analysis.monitor.traffic import NVLINK_COLUMNS, PCIE_COLUMNS, TrafficReader, counted_links
from gpunb.readings.devices import kernel_pids, read_ownership
from gpunb.readings.gpu import GpuInfo, read_info, read_sample, unread_sample
from gpunb.readings.host import read_host_sample
from gpunb.readings.nvml import (
    HUNG_FIX,
    TIMEOUT,
    NvmlSession,
    NvmlStatus,
    Unavailable,
    default_session,
    is_available,
)
from gpunb.readings.test_hooks import active_fakes

# NVML refreshes utilization about every 200 ms on an H200 (measured, see research), so
# faster than 10 Hz only repeats values; below 0.5 Hz a training ramp is a blur.
HZ_DEFAULT = 2.0
HZ_MIN = 0.5
HZ_MAX = 10.0
# The process list costs tens of µs (more with many processes): refresh it rarely.
PROCESS_REFRESH_S = 5.0
# ...but sooner when used memory jumps by more than this (someone allocated or freed).
MEMORY_JUMP_MIB = 256.0
# A day at the default rate; with one GPU that is ~6 MB (see ``bytes_per_tick``).
HISTORY_TICKS = 24 * 3600 * int(HZ_DEFAULT)
# The longest and shortest window a monitor can show (the buffer holds a day at 2 Hz).
WINDOW_MAX_S = HISTORY_TICKS / HZ_DEFAULT
WINDOW_MIN_S = 1.0
THREAD_NAME = "gpunb-sampler"
MIB = 2**20
# NVML time one tick may use (and finding the GPUs when a monitor starts): a hung call costs
# a tick at most this plus one call's timeout, so the thread always comes back to its stop flag.
TICK_BUDGET_S = 0.4
START_BUDGET_S = 0.8
TICK_GRACE_S = 0.02  # a tick waits no longer than its budget (plus this) for a GPU's readings
# When NVML could not list the GPUs (not started, a timeout), ask again after this many
# seconds, doubling up to the second figure.
REDISCOVER_S = (1.0, 60.0)
# A GPU's name, total memory and power limit that NVML did not give at the first read (a
# timeout, a driver still starting) are asked for again after this long, doubling up to the
# second value, until they come (without it the panel said "GPU 0" until %reload_ext).
REFACT_S = (2.0, 60.0)
STATIC_FACTS = ("name", "memory_total_bytes", "power_limit_w")
# stop() waits this long for the thread (a tick is bounded by the budgets above).
STOP_JOIN_S = 0.8

# Per-GPU columns: name -> array typecode. Floats store NaN for a gap; the unsigned
# integer columns store their largest value as the gap marker.
GPU_COLUMNS: tuple[tuple[str, str], ...] = (
    ("mem_used_mib", "f"),  # float32 holds whole MiB exactly up to 16 TiB
    ("mem_own_mib", "f"),  # this kernel's processes (from the last process-list refresh)
    ("mem_free_mib", "f"),
    ("util_pct", "B"),
    ("mem_util_pct", "B"),  # memory-controller busy share
    ("power_w", "f"),
    ("temp_c", "B"),
    ("sm_clock_mhz", "H"),
    ("clock_events", "I"),  # bitmask, gpunb.readings.gpu.CLOCK_EVENT_REASONS
)
HOST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cpu_pct", "f"),
    ("ram_used_mib", "f"),
    ("kernel_rss_mib", "f"),
)
def clamp_hz(hz: Any) -> tuple[float, str]:
    """The rate to use and, when it had to change, why (in words for the user)."""
    if isinstance(hz, bool) or not isinstance(hz, (int, float)) or math.isnan(hz):
        raise ValueError(f"hz must be a number of samples per second, got {hz!r}")
    if hz <= 0:
        raise ValueError(f"hz must be above 0 (samples per second), got {hz:g}")
    if hz < HZ_MIN:
        return HZ_MIN, f"{hz:g} Hz is below the {HZ_MIN:g} Hz minimum; sampling at {HZ_MIN:g} Hz."
    if hz > HZ_MAX:
        return HZ_MAX, (
            f"{hz:g} Hz is above the {HZ_MAX:g} Hz maximum (NVML refreshes its counters about "
            f"every 200 ms, faster sampling only repeats values); sampling at {HZ_MAX:g} Hz."
        )
    return float(hz), ""


def gpu_column(index: int, name: str) -> str:
    return f"gpu{index}_{name}"


@dataclass
class _FaultBook:
    """Which readings are currently missing, so a fault is noted once, not every tick."""

    active: dict[tuple[int, str], str] = field(default_factory=dict)


def _mib(value: Any) -> float | None:
    return value / MIB if is_available(value) and value is not None else None


def _num(value: Any) -> Any:
    return value if is_available(value) and value is not None else None


_FIELD_WORDS = {
    "memory_used_bytes": "memory",
    "util_gpu_pct": "utilization",
    "power_w": "power",
    "temp_c": "temperature",
    "sm_clock_mhz": "SM clock",
    "clock_event_reasons": "clock-event reasons",
}


class Sampler:
    """Reads all GPUs (NVML) and the host every ``1/hz`` seconds into ring buffers.

    One per kernel (``KernelState.sampler``, see ``gpunb.shells.kernel_state``).
    ``start()`` runs a fresh thread each time; ``stop()`` is idempotent and joins it.
    """

    def __init__(
        self,
        nvml: NvmlSession | None = None,
        *,
        hz: float = HZ_DEFAULT,
        capacity: int = HISTORY_TICKS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        own_pids: Iterable[int] | None = None,
        process_refresh_s: float = PROCESS_REFRESH_S,
        read_host: Callable[..., Any] = read_host_sample,
        read_links: bool = True,
    ) -> None:
        self.nvml = nvml if nvml is not None else default_session()
        self.fake = active_fakes(nvml_fake=self.nvml.fake)  # shown in every window: a recording, not this machine
        self.hz, _ = clamp_hz(hz)
        self._max_hz = self.hz  # the fastest rate used so far: how many rows a window may need
        self._clock = clock
        self._wall_clock = wall_clock
        # this kernel's process (its PIDs in every namespace); children are found through it
        self.own_pids = frozenset(own_pids) if own_pids is not None else kernel_pids()
        self.process_refresh_s = process_refresh_s
        self._read_host = read_host
        self._tick_lock = threading.Lock()  # one tick at a time (thread or a test's tick())
        self._data_lock = threading.Lock()  # buffers vs readers
        self._thread_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop_event: threading.Event | None = None
        self._listeners: list[Callable[[Sampler], None]] = []
        self.notes: deque[str] = deque(maxlen=100)
        self._faults = _FaultBook()
        self._listener_errors: set[str] = set()
        self._own_mib: dict[int, float | None] = {}  # from the last process list
        self._other_mib: dict[int, float] = {}  # other processes at that moment
        self._used_at_list: dict[int, float] = {}  # used memory at that moment
        self.processes: dict[int, tuple[Any, ...]] = {}  # GPU index -> the last process list (GpuProcess)
        self.kernel_processes: dict[int, frozenset[int]] = {}  # GPU index -> PIDs of this kernel's processes there
        self._last_process_t: float | None = None
        self._host_thread: int | None = None
        self.thread_cpu_s = 0.0  # CPU time the sampler thread(s) used, all runs together
        self.thread_wall_s = 0.0  # how long they ran
        self._origin: float | None = None
        self.started_unix: float | None = None

        self.status = NvmlStatus(False, "NVML not asked yet.")
        self.gpus: tuple[GpuInfo, ...] = ()
        self.layout = 0  # counts changes of ``gpus`` (views redraw their panels)
        self._store = RingColumns([("t_s", "f"), *HOST_COLUMNS], capacity)
        self._discover_at: float | None = None  # when to look for the GPUs again
        self._discover_delay = REDISCOVER_S[0]
        self.ram_total_mib: float | None = None
        self.cpu_count = os.cpu_count()
        self._refact_at: float | None = None  # when to ask again for facts that were missing
        self._refact_delay = REFACT_S[0]
        # energy and link traffic (traffic.py); False leaves them out (the overhead benchmark's "off")
        self.read_links = read_links
        self.traffic = TrafficReader(self.nvml, clock, grace_s=TICK_GRACE_S)
        self._found_links: dict[int, Any] = {}  # NVLink facts per GPU, from the worker's _find_gpus
        self._discover()

    # -- finding the GPUs -------------------------------------------------------------
    def _find_gpus(self) -> tuple[NvmlStatus, Any]:
        """(status, GPU facts or the Unavailable count); runs on the NVML worker."""
        status = self.nvml.start()
        if not status.ok:
            return status, None
        count = self.nvml.query("nvmlDeviceGetCount")
        if not is_available(count):
            return status, count
        infos = tuple(read_info(self.nvml, i) for i in range(count))
        # NVLink is a static fact (a few calls per GPU): read once here, never per tick
        self._found_links = counted_links(self.nvml, infos)
        return status, infos

    def _discover(self) -> None:
        """Find the GPUs. A failure that may pass (NVML not started yet, a timeout) is
        tried again later with backoff: one bad moment at start must not hide the GPUs."""
        status, found = self.nvml.run(
            self._find_gpus, budget_s=START_BUDGET_S, what="finding the GPUs",
            fallback=lambda why: (NvmlStatus(False, f"NVML did not answer: {why}.", HUNG_FIX, TIMEOUT), None))
        if isinstance(found, Unavailable):
            status = NvmlStatus(False, f"NVML could not count the GPUs: {found.reason}.",
                                "gpunb asks again in a moment; `nvidia-smi` shows what the driver says.", found.code)
        if not status.ok:
            self.status = status
            delay = self._discover_delay
            self._discover_delay = min(REDISCOVER_S[1], delay * 2)
            self._discover_at = time.monotonic() + delay
            # No note: the view says why there is no GPU once, from ``status``; a note per
            # attempt grew into a log ("Looking again in 1/2/4/8/16 s") under the charts.
            return
        self.status, self._discover_at, self._discover_delay = status, None, REDISCOVER_S[0]
        if found:
            links = dict(self._found_links)
            with self._data_lock:
                self._store.add_columns(
                    (gpu_column(info.index, name), code) for info in found for name, code in GPU_COLUMNS)
                self._store.add_columns(
                    (gpu_column(info.index, name), code) for info in found for name, code in PCIE_COLUMNS)
                self._store.add_columns(
                    (gpu_column(i, name), code) for i, g in links.items() if g.active for name, code in NVLINK_COLUMNS)
                self.traffic.set_links(links)
                self.gpus = found
                self.layout += 1
            if self.ticks:  # found late: say so beside the gap before it
                self.note(f"NVML answers again: found {len(found)} GPU(s).")
            self._schedule_refact(reset=True)

    def _missing_facts(self) -> list[int]:
        return [info.index for info in self.gpus
                if not info.lost and not all(is_available(getattr(info, f)) for f in STATIC_FACTS)]

    def _schedule_refact(self, reset: bool = False) -> None:
        if reset:
            self._refact_delay = REFACT_S[0]
        if not self._missing_facts():
            self._refact_at = None
            return
        self._refact_at = self._clock() + self._refact_delay
        self._refact_delay = min(REFACT_S[1], self._refact_delay * 2)

    def _reread_facts(self) -> None:
        """Ask NVML again for the static facts it did not give before; keep what it gave."""
        missing = set(self._missing_facts())
        fresh = self.nvml.run(lambda: {i: read_info(self.nvml, i) for i in missing}, budget_s=START_BUDGET_S,
                              what="the GPUs' names and limits", fallback=lambda why: {})
        merged = []
        changed = False
        for info in self.gpus:
            new = fresh.get(info.index)
            if new is not None:
                values = {f: getattr(new, f) for f in STATIC_FACTS
                          if not is_available(getattr(info, f)) and is_available(getattr(new, f))}
                if values:
                    info = dataclasses.replace(info, **values)
                    changed = True
            merged.append(info)
        if changed:
            with self._data_lock:
                self.gpus = tuple(merged)
                self.layout += 1  # the views redraw their panels with the names
        self._schedule_refact()

    # -- rate and listeners -----------------------------------------------------
    def set_hz(self, hz: float) -> str:
        """Change the rate (all monitors share it); returns a note if it was clamped."""
        self.hz, message = clamp_hz(hz)
        self._max_hz = max(self._max_hz, self.hz)
        return message

    def add_listener(self, fn: Callable[[Sampler], None]) -> None:
        with self._thread_lock:
            if fn not in self._listeners:
                self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Sampler], None]) -> None:
        with self._thread_lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    @property
    def listener_count(self) -> int:
        return len(self._listeners)

    def note(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self._wall_clock()))
        self.notes.append(f"{stamp} {text}")

    # -- one reading ------------------------------------------------------------
    def tick(self) -> None:
        """Read every GPU and the host once, append a row, tell the listeners. NVML gets
        at most TICK_BUDGET_S (less at high rates); what it did not answer is a gap."""
        with self._tick_lock:
            with self.nvml.budget(min(TICK_BUDGET_S, 0.8 / self.hz), "the monitor"):
                if self._discover_at is not None and time.monotonic() >= self._discover_at:
                    self._discover()
                elif self._refact_at is not None and self._clock() >= self._refact_at:
                    self._reread_facts()
                row = self._read_row()
            with self._data_lock:
                self._store.append(row)
        self._notify()

    def _read_row(self) -> dict[str, Any]:
        now = self._clock()
        if self._origin is None:
            self._origin = now
            self.started_unix = self._wall_clock()
        row: dict[str, Any] = {"t_s": now - self._origin}
        used: dict[int, float | None] = {}
        self.traffic.plan([g.index for g in self.gpus if not g.lost], self.hz)
        for info in self.gpus:
            try:
                used[info.index] = self._read_gpu(info.index, row)
            except Exception as exc:  # one GPU's bad reading is a gap in its columns, not a lost row
                used[info.index] = None
                self._note_once(f"GPU {info.index}: reading failed ({exc!r}); shown as a gap.")
        if self.gpus and self._process_list_due(now, used):
            self._last_process_t = now
            self._refresh_processes(used)
        for index, mib in used.items():
            row[gpu_column(index, "mem_own_mib")] = self._own_share(index, mib)
        self._read_host_row(row)
        return row

    def _process_list_due(self, now: float, used: dict[int, float | None]) -> bool:
        """Every ``process_refresh_s``, and sooner (at most once a second) when memory
        moved by more than MEMORY_JUMP_MIB: then who holds it is worth knowing now."""
        last = self._last_process_t
        if last is None or now - last >= self.process_refresh_s:
            return True
        if now - last < min(1.0, self.process_refresh_s):
            return False
        return any(
            mib is not None and abs(mib - self._used_at_list.get(index, mib)) > MEMORY_JUMP_MIB
            for index, mib in used.items()
        )

    def _read_gpu(self, index: int, row: dict[str, Any]) -> float | None:
        t = self._clock()
        s = self.nvml.run(read_sample, self.nvml, index, self._clock, grace_s=TICK_GRACE_S,
                          fallback=lambda why: unread_sample(index, t, why))
        def col(name: str) -> str:
            return gpu_column(index, name)

        used = _mib(s.memory_used_bytes)
        row[col("mem_used_mib")] = used
        row[col("mem_free_mib")] = _mib(s.memory_free_bytes)
        row[col("util_pct")] = _num(s.util_gpu_pct)
        row[col("mem_util_pct")] = _num(s.util_memory_pct)
        row[col("power_w")] = _num(s.power_w)
        row[col("temp_c")] = _num(s.temp_c)
        row[col("sm_clock_mhz")] = _num(s.sm_clock_mhz)
        row[col("clock_events")] = _num(s.clock_event_reasons)
        self._book_faults(index, s)
        if self.read_links and not s.lost:
            for text in self.traffic.read(index, row, _num(s.power_w), self._origin or 0.0):
                self.note(text)
        return used

    def _own_share(self, index: int, used: float | None) -> float | None:
        """This kernel's share of ``used``. Between process lists, other processes'
        memory is held at its last value and small changes count as this kernel's (the
        one training in this notebook) if it held GPU memory at the last look; big
        changes bring the next list forward (``_process_list_due``)."""
        own = self._own_mib.get(index)
        if own is None or used is None:
            return None
        if own == 0:
            return 0.0
        return max(0.0, min(used, used - self._other_mib.get(index, 0.0)))

    def _book_faults(self, index: int, s: Any) -> None:
        missing: dict[tuple[int, str], str] = {}
        if s.lost:
            missing[(index, "lost")] = (
                f"GPU {index} is lost (NVML: GPU is lost); its charts show a gap. Fix: check "
                "`nvidia-smi` and `dmesg` (Xid errors); the GPU usually needs a reset or reboot, "
                "and this kernel a restart."
            )
        else:
            for attr, words in _FIELD_WORDS.items():
                value = getattr(s, attr)
                if isinstance(value, Unavailable):
                    missing[(index, words)] = f"GPU {index} {words}: {value} — shown as a gap."
        book = self._faults.active
        for key, text in missing.items():
            if key not in book:
                self.note(text)
        for key in [k for k in book if k[0] == index and k not in missing]:
            self.note(f"GPU {index} {'is back' if key[1] == 'lost' else key[1] + ' readings are back'}.")
            del book[key]
        book.update(missing)

    def _refresh_processes(self, used: dict[int, float | None]) -> None:
        for info in self.gpus:
            # this kernel and its child processes (devices.py); MIG and some drivers do not give
            # per-process memory: unknown (None), not zero
            own = read_ownership(self.nvml, info.index, pids=self.own_pids)
            self.processes[info.index] = own.processes + own.others
            self.kernel_processes[info.index] = frozenset(p.pid for p in own.processes)
            own_mib = own.own_bytes / MIB if own.own_bytes is not None else None
            self._own_mib[info.index] = own_mib
            now_used = used.get(info.index)
            if now_used is not None:
                self._used_at_list[info.index] = now_used
                self._other_mib[info.index] = max(0.0, now_used - (own_mib or 0.0))

    def _read_host_row(self, row: dict[str, Any]) -> None:
        try:
            host = self._read_host(self._clock)
        except Exception as exc:  # psutil can fail in odd sandboxes; a gap, not a crash
            self._note_once(f"host readings failed: {exc!r}")
            return
        # psutil's non-blocking cpu_percent measures since the previous call *in this
        # thread*; the first call of a fresh thread has nothing to compare with.
        thread = threading.get_ident()
        row["cpu_pct"] = host.cpu_pct if self._host_thread == thread else None
        self._host_thread = thread
        row["ram_used_mib"] = host.ram_used_bytes / MIB
        row["kernel_rss_mib"] = host.process_rss_bytes / MIB
        self.ram_total_mib = host.ram_total_bytes / MIB

    def _note_once(self, text: str) -> None:
        if text not in self._listener_errors:
            if len(self._listener_errors) > 200:  # bounded, like everything the thread keeps
                self._listener_errors.clear()
            self._listener_errors.add(text)
            self.note(text)

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn(self)
            except Exception as exc:  # a broken view must not stop the sampling
                self._note_once(f"a monitor view failed to update: {exc!r}")

    # -- the thread ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> None:
        """Start sampling in a fresh thread (no-op if already running). A thread of an
        earlier stop that is still finishing its tick is waited for first: never two."""
        _wait_for_stopped_threads()
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                return
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,), name=THREAD_NAME, daemon=True)
            self._stop_event, self._thread = stop, thread
            thread.start()

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        """Stop the thread and wait for it (a tick is bounded, so briefly); safe to call
        any number of times."""
        with self._thread_lock:
            stop, thread = self._stop_event, self._thread
            self._stop_event = self._thread = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():  # inside a slow tick: the next start() waits for it
                with _stopping_lock:
                    _stopping.append(thread)

    def _run(self, stop: threading.Event) -> None:
        cpu0, wall0 = time.thread_time(), time.monotonic()
        cpu_before, wall_before = self.thread_cpu_s, self.thread_wall_s
        deadline = time.monotonic()
        while True:
            try:
                self.tick()
            except Exception as exc:  # never let one bad tick end the monitor
                self._note_once(f"a sampler tick failed: {exc!r}")
            self.thread_cpu_s = cpu_before + time.thread_time() - cpu0
            self.thread_wall_s = wall_before + time.monotonic() - wall0
            deadline += 1.0 / self.hz
            delay = deadline - time.monotonic()
            if delay < 0:  # fell behind (a suspended laptop, a busy host): no burst of ticks
                deadline, delay = time.monotonic(), 0.0
            if stop.wait(delay):
                break
        # Count the whole life of the thread, waits included (CPU per second of running).
        self.thread_cpu_s = cpu_before + time.thread_time() - cpu0
        self.thread_wall_s = wall_before + time.monotonic() - wall0

    # -- reading the buffers --------------------------------------------------------
    def now_s(self) -> float | None:
        """The current time on the series' axis (``t_s``), to mark events beside the
        readings; None before the first tick."""
        return None if self._origin is None else self._clock() - self._origin

    @property
    def ticks(self) -> int:
        return self._store.appended

    @property
    def bytes_per_tick(self) -> int:
        return self._store.bytes_per_row

    @property
    def buffer_bytes(self) -> int:
        return self._store.nbytes

    @property
    def capacity(self) -> int:
        return self._store.capacity

    def _rows(self, seconds: float | None) -> dict[str, list[Any]]:
        with self._data_lock:
            if seconds is None:
                return self._store.tail()
            # Enough rows for the window even if the rate was higher earlier.
            n = math.ceil(seconds * self._max_hz) + 2
            rows = self._store.tail(n)
        t = rows["t_s"]
        if t:
            first = next((i for i, v in enumerate(t) if v is not None and v >= t[-1] - seconds), len(t))
            rows = {k: v[first:] for k, v in rows.items()}
        return rows

    def samples(self, seconds: float | None = None) -> dict[str, list[Any]]:
        """All buffered readings (or the last ``seconds``) as flat columns: ``t_s``
        (seconds since the first tick), ``gpu<i>_<name>`` per GPU including
        ``gpu<i>_mem_other_mib``, and the host columns. Gaps are ``None``."""
        rows = self._rows(seconds)
        for info in self.gpus:
            used = rows[gpu_column(info.index, "mem_used_mib")]
            own = rows[gpu_column(info.index, "mem_own_mib")]
            rows[gpu_column(info.index, "mem_other_mib")] = _other(used, own)
        return rows

    def _gpu_series(self, rows: dict[str, list[Any]], devices: Iterable[int] | None) -> tuple[GpuSeries, ...]:
        wanted = None if devices is None else set(devices)
        limits = self.traffic.limits(self.gpus)
        gpus = []
        for info in self.gpus:
            if wanted is not None and info.index not in wanted:
                continue
            prefix = gpu_column(info.index, "")
            cols = {name[len(prefix):]: values for name, values in rows.items() if name.startswith(prefix)}
            if cols:
                cols["mem_other_mib"] = _other(cols["mem_used_mib"], cols["mem_own_mib"])
            name = info.name if is_available(info.name) else f"GPU {info.index}"
            lost = info.lost or (info.index, "lost") in self._faults.active
            gpus.append(GpuSeries(
                info.index, str(name), _mib(info.memory_total_bytes), _num(info.power_limit_w), lost, cols,
                _num(info.max_sm_clock_mhz), _num(info.temp_slowdown_c),
                limits.get(info.index) if self.read_links else None, self.traffic.energy(info.index),
            ))
        return tuple(gpus)

    def rows_since(self, index: int) -> tuple[int, dict[str, list[Any]]]:
        """Rows from global row number ``index`` on (as many as are still buffered), for
        views that draw incrementally: returns the number of the first row given and the
        columns (as ``samples()``, without derived columns)."""
        with self._data_lock:
            oldest = self._store.appended - len(self._store)
            first = max(index, oldest)
            return first, self._store.tail(self._store.appended - first)

    def gpu_series(self, devices: Iterable[int] | None = None) -> tuple[GpuSeries, ...]:
        """The shown GPUs' facts (name, total memory, power limit, lost) without readings."""
        return self._gpu_series({}, devices)

    def imbalance(self, devices: Iterable[int] | None = None, seconds: float = IMBALANCE_WINDOW_S) -> list[Imbalance]:
        """Unbalanced GPUs over the last ``seconds`` (analysis/monitor/imbalance.py): one idle while the
        others work, or one holding far more memory. Empty when balanced or too soon to say."""
        rows = self._rows(seconds)
        return find_imbalance(rows["t_s"], self._gpu_series(rows, devices), seconds)

    def window(self, seconds: float, devices: Iterable[int] | None = None) -> Window:
        """The last ``seconds`` of readings of the shown GPUs and the host."""
        rows = self._rows(seconds)
        host = {name: rows[name] for name, _ in HOST_COLUMNS}
        return Window(
            t_s=rows["t_s"],
            seconds=seconds,
            hz=self.hz,
            gpus=self._gpu_series(rows, devices),
            host=host,
            ram_total_mib=self.ram_total_mib,
            cpu_count=self.cpu_count,
            nvml=self.status,
            notes=tuple(self.notes),
            running=self.running,
            fake=self.fake,
            gpu_count=len(self.gpus),
            started_unix=self.started_unix,
            tariff=session_tariff(),
        )


_stopping: list[threading.Thread] = []  # stopped sampler threads still finishing a tick
_stopping_lock = threading.Lock()


def _wait_for_stopped_threads(timeout: float = 1.0) -> None:
    with _stopping_lock:
        threads = [t for t in _stopping if t.is_alive()]
        _stopping[:] = threads
    end = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))


def _other(used: list[Any], own: list[Any]) -> list[Any]:
    return [None if u is None or o is None else max(0.0, u - o) for u, o in zip(used, own)]
