"""The one module that talks to NVML (package ``nvidia-ml-py``, module ``pynvml``).

Every NVML call goes through :meth:`NvmlSession.query`, which turns NVML errors and
malformed values into :class:`Unavailable` values (``not supported``, ``GPU is lost``,
``no permission``, ``malformed value``...), so a missing sensor, a dead GPU or a lying
driver never becomes a crash in a notebook.

Every call also has a deadline. An NVML call is a C call that cannot be interrupted, and
a stuck driver can block one for minutes, so the calls run on a worker thread
(``gpunb-nvml``): a caller waits at most ``CALL_TIMEOUT_S`` for one call and at most its
budget (``with session.budget(1.0):``, or :meth:`NvmlSession.run`) for all it reads. A
call that times out or answers only after ``SLOW_CALL_S`` is not asked again for a while
(that function on that GPU; after ``SLOW_LIMIT`` slow calls, NVML as a whole), and the
``Unavailable`` a reader gets says so. A worker stuck in a hung call is replaced at most
``MAX_STUCK_WORKERS`` times, so hung threads never pile up. Failures that may pass (a
failed ``nvmlInit``, an NVML TIMEOUT) are retried later with backoff, never remembered
for the life of the process.

The library is passed in (``lib``): the real ``pynvml`` module by default, or
``gpunb.testing.FakePynvml`` in tests, which implements the same functions from
recorded H200 readings.

One module on purpose (~770 lines): the design allows one place that touches NVML, and the
worker thread, the deadlines and the errors-as-values are one mechanism that every read passes
through; split, each half would reach into the other's state.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gpunb.readings.nvml_values import misfit

T = TypeVar("T")

# NVML return codes (nvml.h ``nvmlReturn_t``); duplicated here so that reading them
# does not require the library to be importable.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18

# Deadlines. A healthy call takes 1-35 µs on the H200 and the utilization-sample buffer
# 2.5 ms (research/perf-reliability-anchors.md §1.1); nvmlInit ~12 ms, longer on a cold
# driver, so a cell waits for it at most INIT_WAIT_S and it finishes in the background.
CALL_TIMEOUT_S = 0.25  # longest wait for one call
SLOW_CALL_S = 0.1  # an answer slower than this puts that function on a cooldown
SLOW_LIMIT, SLOW_WINDOW_S = 3, 10.0  # this many slow calls this close together: NVML is paused
COOLDOWN_S = (5.0, 300.0)  # first and longest cooldown of a slow function (doubles each time)
PAUSE_S = (10.0, 300.0)  # the same for NVML as a whole
RETRY_S = (1.0, 60.0)  # a failed nvmlInit is tried again after this (doubles each time)
INIT_WAIT_S = 1.0
RUN_BUDGET_S = 1.0  # default budget of one run()
MAX_STUCK_WORKERS = 2
IDLE_EXIT_S = 10.0  # an idle worker thread ends; the next read starts another
WORKER_THREAD_NAME = "gpunb-nvml"

_REASONS: dict[int | None, str] = {
    NOT_SUPPORTED: "not supported on this GPU/driver",
    NO_PERMISSION: "no permission",
    DRIVER_NOT_LOADED: "driver not loaded",
    TIMEOUT: "the driver timed out",
    LIBRARY_NOT_FOUND: "NVML library not found",
    FUNCTION_NOT_FOUND: "function not in this driver",
    GPU_IS_LOST: "GPU is lost",
    LIB_RM_VERSION_MISMATCH: "driver/library version mismatch",
}


@dataclass(frozen=True)
class Unavailable:
    """A reading NVML could not give, with the reason in words. Falsy."""

    reason: str
    code: int | None = None

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"n/a ({self.reason})"


def is_available(value: Any) -> bool:
    return not isinstance(value, Unavailable)


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML could be started, and if not: why and what to do."""

    ok: bool
    cause: str = ""
    fix: str = ""
    code: int | None = None


def _error_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _status_for_init_error(code: int | None, message: str) -> NvmlStatus:
    if code == LIBRARY_NOT_FOUND:
        return NvmlStatus(
            False,
            "The NVIDIA driver's NVML library (libnvidia-ml.so.1) was not found: no NVIDIA "
            "driver is installed here, or this container was started without GPU access.",
            "Install the NVIDIA driver (`nvidia-smi` must work), or start the container with "
            "`--gpus all` (Docker) / the NVIDIA container toolkit. On a CPU-only machine this is expected.",
            code,
        )
    if code == DRIVER_NOT_LOADED:
        return NvmlStatus(
            False,
            "The NVIDIA kernel driver is not loaded.",
            "Check `nvidia-smi` and `dmesg | grep -i nvidia`; load the module (`sudo modprobe nvidia`) "
            "or reboot after a driver install.",
            code,
        )
    if code == LIB_RM_VERSION_MISMATCH:
        return NvmlStatus(
            False,
            "The driver was upgraded but the old kernel module is still loaded (library/kernel version mismatch).",
            "Reboot the machine (or reload the nvidia kernel modules).",
            code,
        )
    if code == NO_PERMISSION:
        return NvmlStatus(
            False,
            "No permission to open the NVIDIA device files.",
            "Ask the administrator to add you to the group that owns /dev/nvidia* (often `video`).",
            code,
        )
    return NvmlStatus(False, f"NVML could not start: {message}",
                      "Run `nvidia-smi` to see what the driver says; gpunb tries again in a moment.", code)


class _Backoff:
    """Delays that double after each failure, from ``first`` up to ``longest``."""

    def __init__(self, first: float, longest: float) -> None:
        self.first, self.longest, self.next = first, longest, first

    def delay(self) -> float:
        delay, self.next = self.next, min(self.longest, self.next * 2)
        return delay

    def reset(self) -> None:
        self.next = self.first


@dataclass
class _Cooling:
    """A function (on one GPU) that answered too slowly: skipped until ``until``."""

    backoff: _Backoff
    until: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class _Call:
    """The NVML call a worker is inside right now."""

    name: str
    key: tuple[str, int | None]
    t0: float


class _Job:
    __slots__ = ("args", "cancelled", "deadline", "done", "error", "fn", "given_up", "refused", "result", "what")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float | None, what: str) -> None:
        self.fn, self.args, self.deadline, self.what = fn, args, deadline, what
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.cancelled = False
        # its caller waited a whole call's timeout for this one call and left it running: the
        # worker counts as stuck from then on, whatever the call's own clock says
        self.given_up = False
        self.refused: str | None = None  # why it was never run (no worker left to run it)

    def refuse(self, why: str) -> None:
        self.refused = why
        self.done.set()


class _Worker(threading.Thread):
    """Runs NVML calls for a session, so a caller can stop waiting for a call that hangs."""

    def __init__(self, session: NvmlSession) -> None:
        super().__init__(name=WORKER_THREAD_NAME, daemon=True)
        self.session = session
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.call: _Call | None = None
        self.job: _Job | None = None
        self.abandoned = False  # its caller gave up on a hung call; it ends after that job

    def run(self) -> None:
        try:
            while not self.abandoned:
                try:
                    job = self.jobs.get(timeout=IDLE_EXIT_S)
                except queue.Empty:
                    if self.session._retire_idle(self):
                        return
                    continue
                if job is None:
                    return
                if job.cancelled:
                    continue
                self.job = job
                try:
                    job.result = job.fn(*job.args)
                except BaseException as exc:  # handed to the caller, who decides
                    job.error = exc
                finally:
                    self.job = None
                    job.done.set()
        finally:
            self.session._worker_ended(self)


class PendingRun(Generic[T]):
    """``fn(*args)`` queued on the NVML worker; ``result()`` waits for it: at most ``wait`` (a
    run: its budget plus one call's timeout), and never longer than one call's timeout for a
    single call that hangs. A run that met a hung call is run once more (the hung function is
    now skipped), so one hang costs a part of it, not all of it. ``NvmlSession`` waits at once
    for a call or a :meth:`~NvmlSession.run`; :meth:`~NvmlSession.run_soon` hands this to the
    caller, who does its own work meanwhile."""

    def __init__(self, session: NvmlSession, fn: Callable[..., T], args: tuple[Any, ...], *, wait: float,
                 what: str, fallback: Callable[[str], T], budget_s: float | None = None, grace_s: float = 0.0,
                 retry: bool = True) -> None:
        self._session, self._fn, self._args, self._what, self._fallback = session, fn, args, what, fallback
        self._budget_s, self._grace_s, self._retry = budget_s, grace_s, retry
        self._job: _Job | None = None
        self._worker: _Worker | None = None
        self._refused: str | None = None  # why it was never queued (the fallback answers)
        self._answered = False  # asked on the worker itself: run there and then
        self._value: Any = None
        self._end = 0.0
        if session._current_worker() is not None:
            self._value, self._answered = fn(*args), True
            return
        now = time.monotonic()
        local = session._caller
        deadline = getattr(local, "deadline", None)
        owner = getattr(local, "what", "")
        if budget_s is not None:
            deadline = now + budget_s if deadline is None else min(deadline, now + budget_s)
        self._deadline = deadline
        if deadline is not None:
            left = deadline - now
            if left <= 0:
                self._refused = (f"not read: {owner or 'this reading'}'s NVML time budget was used up "
                                 "(NVML answered slowly)")
                return
            wait = min(wait, left) if budget_s is None else left
        if budget_s is not None:
            wait += grace_s  # a call running at the deadline may still finish
        self._wait, self._end = wait, now + wait
        with session._lock:
            if getattr(fn, "__func__", None) is not NvmlSession._start_here:
                session._wait_for_init(deadline)
            if session._init_since is not None and getattr(fn, "__func__", None) is not NvmlSession._start_here:
                now = time.monotonic()
                self._refused = f"NVML is still starting (nvmlInit has run for {now - session._init_since:.1f} s)"
                return
            worker, why = session._live_worker(now)
            if worker is None:
                self._refused = why
                return
            self._job, self._worker = _Job(fn, args, deadline, owner or what), worker
            worker.jobs.put(self._job)

    def ready(self) -> bool:
        """True once ``result()`` would not wait for the worker."""
        job = self._job
        return job is None or job.done.is_set() or time.monotonic() >= self._end

    def result(self) -> T:
        """What ``fn(*args)`` returned, or the fallback's answer (see the class doc)."""
        if self._answered:
            return cast(T, self._value)
        job, worker, session, fallback = self._job, self._worker, self._session, self._fallback
        if job is None or worker is None:
            return fallback(self._refused or "not queued")
        end, timeout = self._end, session.call_timeout_s
        hung = False
        while True:
            call = worker.call
            started = time.monotonic() if call is None or call.name == "nvmlInit" else call.t0
            limit = min(end, started + timeout)  # then look again: is a call hanging?
            if job.done.wait(max(0.0, limit - time.monotonic()) + 0.001):
                if job.refused is not None:
                    return fallback(job.refused)
                if job.error is not None:
                    raise job.error
                return cast(T, job.result)  # what the worker's fn(*args) returned
            now = time.monotonic()
            call = worker.call
            if call is not None and call.name != "nvmlInit" and now - call.t0 > timeout:
                hung = True
                break
            if now >= end:
                # A single call (no budget) waited for until its end: the call started a little
                # after this wait did (the worker's nvmlInit, the handle), so its own clock may be
                # just short of the timeout. Left as it was, the next read queued behind it and
                # waited once more (the 1-in-6 failure of test_run_soon_gives_its_fallback...).
                if self._budget_s is None and call is not None and call.name != "nvmlInit" and worker.job is job:
                    job.given_up = True
                break
        job.cancelled = True
        late = session._why_late(worker, self._what, now - (end - self._wait))
        deadline = self._deadline
        if hung and self._retry and self._budget_s is not None and (deadline is None or time.monotonic() < deadline):
            again = PendingRun(session, self._fn, self._args, wait=self._wait, what=self._what,
                               fallback=lambda _why: fallback(late),
                               budget_s=max(0.0, (deadline or end) - time.monotonic()), grace_s=self._grace_s,
                               retry=False)
            return again.result()
        return fallback(late)


class NvmlSession:
    """A started NVML library whose every call has a deadline (see the module doc)."""

    def __init__(self, lib: Any = None, *, init_problem: NvmlStatus | None = None,
                 call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._lib = lib
        self._init_problem = init_problem  # a reason NVML must not even be tried (bad configuration)
        self.call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._status: NvmlStatus | None = None
        self._retry_at = 0.0
        self._retry = _Backoff(*RETRY_S)
        self._init_since: float | None = None  # nvmlInit is running since then
        self._init_ended = threading.Condition(self._lock)  # notified when an nvmlInit ends
        self._handles: dict[int, Any] = {}
        self._handle_index: dict[int, int] = {}  # id(handle) -> GPU index, to name slow calls
        self._worker: _Worker | None = None
        self._stuck: list[_Worker] = []  # workers left inside a hung call
        self._cooling: dict[tuple[str, int | None], _Cooling] = {}
        self._slow_times: deque[float] = deque()
        self._paused_until = 0.0
        self._pause = _Backoff(*PAUSE_S)
        self._pause_reason = ""
        self._caller = threading.local()  # per calling thread: budget deadline and its owner
        _SESSIONS.add(self)

    # -- life cycle -------------------------------------------------------------
    def start(self) -> NvmlStatus:
        """Load and initialise NVML. Success is kept; a failure is kept only until its
        retry time (1 s, doubling up to a minute), since a driver may come back."""
        worker = self._current_worker()
        if worker is not None:
            return self._start_here()
        with self._lock:
            self._wait_for_init(getattr(self._caller, "deadline", None))
            known = self._known_status()
        if known is not None:
            return known
        return self._hop(self._start_here, (), wait=INIT_WAIT_S, what="nvmlInit",
                         fallback=lambda why: NvmlStatus(False, f"NVML did not start: {why}", HUNG_FIX, TIMEOUT))

    def _wait_for_init(self, deadline: float | None) -> None:
        """Wait (lock held) for an nvmlInit another thread runs, within that init's own window
        (INIT_WAIT_S from its start) and the caller's budget: a driver that is slow to start
        (no persistence mode: 0.2-2 s) gives the real answer when it comes in time, and is
        said as slow (TIMEOUT), never as absent, when it does not. One window per init, so a
        cell that already waited it out is not made to wait again."""
        while self._init_since is not None:
            until = self._init_since + INIT_WAIT_S
            if deadline is not None:
                until = min(until, deadline)
            left = until - time.monotonic()
            if left <= 0:
                return
            self._init_ended.wait(left)

    def _known_status(self) -> NvmlStatus | None:
        """The status when no nvmlInit is needed now (lock held)."""
        now = time.monotonic()
        if self._init_since is not None:
            return NvmlStatus(False, f"NVML is still starting (nvmlInit has run for {now - self._init_since:.1f} s).",
                              HUNG_FIX, TIMEOUT)
        if self._status is not None and (self._status.ok or now < self._retry_at):
            return self._status
        return None

    def _start_here(self) -> NvmlStatus:
        with self._lock:
            known = self._known_status()
            if known is not None:
                return known
            self._init_since = time.monotonic()
        status = NvmlStatus(False, "NVML could not start.", "Run `nvidia-smi`.")
        try:
            status = self._init_library()
        finally:
            with self._lock:
                self._init_since = None
                self._init_ended.notify_all()
                self._status = status
                if status.ok:
                    self._retry.reset()
                else:
                    self._retry_at = time.monotonic() + self._retry.delay()
        return status

    def _init_library(self) -> NvmlStatus:
        if self._init_problem is not None:
            return self._init_problem
        if self._lib is None:
            try:
                import pynvml  # the only import of pynvml in gpunb
            except ImportError:
                return NvmlStatus(
                    False,
                    "The Python package nvidia-ml-py (module `pynvml`) is not installed.",
                    "`pip install nvidia-ml-py` (not the deprecated `pynvml` package).",
                )
            self._lib = pynvml
        try:
            self._lib.nvmlInit()
        except Exception as exc:  # NVMLError and OSError from ctypes
            return _status_for_init_error(_error_code(exc), _safe_str(exc))
        return NvmlStatus(True)

    @property
    def lib(self) -> Any:
        return self._lib

    @property
    def fake(self) -> bool:
        """True when the library is gpunb's recorded fake (tests, ``GPUNB_FAKE_NVML``), not a driver."""
        return bool(getattr(self._lib, "FAKE", False))

    # -- deadlines ----------------------------------------------------------------
    @contextmanager
    def budget(self, seconds: float, what: str = "this cell") -> Iterator[None]:
        """Everything this thread reads from NVML inside the block shares ``seconds``;
        once they are spent, reads return ``Unavailable`` at once (nested budgets keep
        the tighter deadline)."""
        deadline = time.monotonic() + seconds
        worker = self._current_worker()
        if worker is not None:  # inside a run(): tighten the job's own deadline
            job = worker.job
            before = job.deadline if job is not None else None
            if job is not None:
                job.deadline = deadline if before is None else min(before, deadline)
            try:
                yield
            finally:
                if job is not None:
                    job.deadline = before
            return
        local = self._caller
        saved = getattr(local, "deadline", None), getattr(local, "what", "")
        if saved[0] is None or deadline < saved[0]:
            local.deadline, local.what = deadline, what
        try:
            yield
        finally:
            local.deadline, local.what = saved

    def run(self, fn: Callable[..., T], *args: Any, fallback: Callable[[str], T],
            budget_s: float = RUN_BUDGET_S, what: str = "", grace_s: float | None = None) -> T:
        """``fn(*args)`` on the NVML worker, its NVML reads done there without a hop each.
        The caller waits until the budget (its own, or ``budget_s``, whichever ends first)
        plus ``grace_s`` (default: one call's timeout, for a call running at the deadline);
        reads after the deadline return ``Unavailable`` and the partial result comes back.
        ``fallback(reason)`` is returned when nothing came back in time (a call hung)."""
        return self.run_soon(fn, *args, fallback=fallback, budget_s=budget_s, what=what, grace_s=grace_s).result()

    def run_soon(self, fn: Callable[..., T], *args: Any, fallback: Callable[[str], T],
                 budget_s: float = RUN_BUDGET_S, what: str = "", grace_s: float | None = None) -> PendingRun[T]:
        """:meth:`run` queued now, waited for later (``.result()``): the caller goes on with its
        own work while the worker reads (a profiled cell's end, the memory timeline's device
        reading). The same deadlines hold; the wait is in ``result()``."""
        return PendingRun(self, fn, args, wait=budget_s, what=what or getattr(fn, "__name__", "reading"),
                          fallback=fallback, budget_s=budget_s,
                          grace_s=self.call_timeout_s if grace_s is None else grace_s)

    def _hop(self, fn: Callable[..., T], args: tuple[Any, ...], *, wait: float, what: str,
             fallback: Callable[[str], T]) -> T:
        """One call (or nvmlInit) on the worker, waited for at most ``wait`` (PendingRun)."""
        return PendingRun(self, fn, args, wait=wait, what=what, fallback=fallback).result()

    def _why_late(self, worker: _Worker, what: str, waited: float) -> str:
        call = worker.call
        if call is None:
            return f"NVML did not answer {what} within {waited:.2f} s"
        return f"NVML did not answer {_label(call.key)} within {time.monotonic() - call.t0:.2f} s"

    def _current_worker(self) -> _Worker | None:
        thread = threading.current_thread()
        return thread if isinstance(thread, _Worker) and thread.session is self else None

    def _live_worker(self, now: float) -> tuple[_Worker | None, str]:
        """The worker to queue on (lock held): a fresh one when the current one is stuck in
        a hung call, none when MAX_STUCK_WORKERS are stuck already."""
        worker = self._worker
        if worker is not None and not worker.is_alive():
            worker = self._worker = None  # ended (idle, or this process was forked)
        waiting: list[_Job] = []
        if worker is not None:
            call, job = worker.call, worker.job
            if call is not None and call.name != "nvmlInit" and (
                    now - call.t0 > self.call_timeout_s or (job is not None and job.given_up)):
                waiting = self._abandon(worker, call, now)
                worker = None
        if worker is None:
            self._stuck = [w for w in self._stuck if w.is_alive()]
            if len(self._stuck) >= MAX_STUCK_WORKERS:
                calls = "; ".join(f"{_label(w.call.key)} for {now - w.call.t0:.0f} s"
                                  for w in self._stuck if w.call is not None)
                why = (f"NVML is not answering: {len(self._stuck)} calls hang ({calls}); "
                       "readings resume when they return")
                for job in waiting:
                    job.refuse(why)
                return None, why
            worker = self._worker = _Worker(self)
            for job in waiting:  # queued behind the hung call: they go first on the fresh worker
                worker.jobs.put(job)
            worker.start()
        return worker, ""

    def _abandon(self, worker: _Worker, call: _Call, now: float) -> list[_Job]:
        """Leave ``worker`` inside its hung call; returns the jobs queued behind it (lock held)."""
        worker.abandoned = True
        self._stuck.append(worker)
        self._worker = None
        self._note_slow(call.key, f"NVML did not answer {_label(call.key)} within {self.call_timeout_s:g} s", now)
        waiting = []
        while True:
            try:
                job = worker.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                waiting.append(job)
        return waiting

    def _retire_idle(self, worker: _Worker) -> bool:
        with self._lock:
            if worker.jobs.empty() and self._worker is worker:
                self._worker = None
                return True
            return worker.abandoned or self._worker is not worker

    def _worker_ended(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._stuck:
                self._stuck.remove(worker)
            if self._worker is worker:
                self._worker = None

    def stop_worker(self, timeout: float = 0.2) -> None:
        """End the worker thread (the next read starts a fresh one): ``%unload_ext``
        leaves no thread behind. A worker stuck in a hung call cannot be ended."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.jobs.put(None)
            if worker is not threading.current_thread():
                worker.join(timeout)

    # -- slowness bookkeeping -------------------------------------------------------
    def _skip_reason(self, key: tuple[str, int | None]) -> str:
        """Why not to call ``key`` now: the job's deadline passed, NVML as a whole is left
        alone, or this function on this GPU answered too slowly lately."""
        now = time.monotonic()
        worker = self._current_worker()
        if worker is not None:
            if worker.abandoned:
                return "not read: an earlier NVML call of this reading hung"
            job = worker.job
            if job is not None and job.deadline is not None and now >= job.deadline:
                return f"not read: {job.what or 'this reading'}'s NVML time budget was used up (NVML answered slowly)"
        with self._lock:
            for stuck in self._stuck:
                call = stuck.call
                if call is not None and call.key == key:  # never a second thread into the same hang
                    return f"NVML has not answered {_label(key)} for {now - call.t0:.0f} s; not asked while it hangs"
            if now < self._paused_until:
                return f"{self._pause_reason}; asked again in {self._paused_until - now:.0f} s"
            cooling = self._cooling.get(key)
            if cooling is not None and now < cooling.until:
                return f"{cooling.reason}; asked again in {cooling.until - now:.0f} s"
        return ""

    def _book(self, key: tuple[str, int | None], elapsed: float) -> None:
        with self._lock:
            if elapsed < SLOW_CALL_S:
                if key in self._cooling:
                    del self._cooling[key]  # answering normally again
                if self._paused_until and time.monotonic() >= self._paused_until:
                    self._paused_until = 0.0
                    self._pause.reset()
                return
            self._note_slow(key, f"NVML took {elapsed:.2f} s to answer {_label(key)}", time.monotonic())

    def _note_slow(self, key: tuple[str, int | None], what: str, now: float) -> None:
        """Skip ``key`` for a while; after SLOW_LIMIT slow calls in SLOW_WINDOW_S, all of
        NVML (lock held)."""
        cooling = self._cooling.setdefault(key, _Cooling(_Backoff(*COOLDOWN_S)))
        cooling.until = now + cooling.backoff.delay()
        cooling.reason = what
        times = self._slow_times
        times.append(now)
        while times and now - times[0] > SLOW_WINDOW_S:
            times.popleft()
        if len(times) >= SLOW_LIMIT:
            times.clear()
            self._paused_until = now + self._pause.delay()
            self._pause_reason = (f"NVML is answering too slowly ({SLOW_LIMIT} slow calls within "
                                  f"{SLOW_WINDOW_S:g} s, the last: {what}); gpunb leaves it alone for a while")

    def trouble(self) -> tuple[str, ...]:
        """What is being skipped now and why (for reports): slow functions, a pause, hung calls."""
        now = time.monotonic()
        with self._lock:
            out = [self._pause_reason] if now < self._paused_until else []
            out += [c.reason for c in self._cooling.values() if now < c.until]
            out += [f"{_label(w.call.key)} has hung for {now - w.call.t0:.0f} s" for w in self._stuck
                    if w.call is not None]
        return tuple(out)

    # -- queries ----------------------------------------------------------------
    def query(self, name: str, *args: Any) -> Any:
        """Call ``pynvml.<name>(*args)`` with a deadline; NVML errors, timeouts and
        malformed values come back as :class:`Unavailable`."""
        if self._current_worker() is not None:
            return self._call(name, args)
        return self._hop(self._call, (name, args), wait=self.call_timeout_s, what=name,
                         fallback=lambda why: Unavailable(why, TIMEOUT))

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        """One NVML call, on the worker."""
        status = self._start_here()
        if not status.ok:
            return Unavailable(status.cause, status.code)
        key = (name, args[0] if name == "nvmlDeviceGetHandleByIndex" and args else
               self._handle_index.get(id(args[0])) if args else None)
        why = self._skip_reason(key)
        if why:
            return Unavailable(why, TIMEOUT)
        fn: Callable[..., Any] | None = getattr(self._lib, name, None)
        if fn is None:
            return Unavailable(f"{name} missing from nvidia-ml-py (upgrade it)", FUNCTION_NOT_FOUND)
        worker = self._current_worker()
        t0 = time.monotonic()
        if worker is not None:
            worker.call = _Call(name, key, t0)
        try:
            value = fn(*args)
        except Exception as exc:
            code = _error_code(exc)
            value = Unavailable(_REASONS.get(code, _safe_str(exc) or type(exc).__name__), code)
        finally:
            if worker is not None:
                worker.call = None
        if worker is None or not worker.abandoned:  # an abandoned call was booked when it was left
            self._book(key, time.monotonic() - t0)
        if isinstance(value, Unavailable):
            return value
        if isinstance(value, bytes):  # older bindings return bytes for strings
            value = value.decode(errors="replace")
        why = misfit(name, value)
        return Unavailable(why) if why else value

    def handle(self, index: int) -> Any:
        """The NVML handle of GPU ``index`` (cached), or :class:`Unavailable`."""
        cached = self._handles.get(index)
        if cached is not None:
            return cached
        h = self.query("nvmlDeviceGetHandleByIndex", index)
        if is_available(h):
            self._handles[index] = h
            self._handle_index[id(h)] = index
        return h

    def device_query(self, index: int, name: str, *args: Any) -> Any:
        if self._current_worker() is None:  # one hop for the handle and the call
            return self._hop(self._device_query_here, (index, name, args), wait=self.call_timeout_s, what=name,
                             fallback=lambda why: Unavailable(why, TIMEOUT))
        return self._device_query_here(index, name, args)

    def _device_query_here(self, index: int, name: str, args: tuple[Any, ...]) -> Any:
        h = self.handle(index)
        if not is_available(h):
            return h
        return self.query(name, h, *args)  # on the worker: no hop

    def device_count(self) -> int:
        n = self.query("nvmlDeviceGetCount")
        return n if is_available(n) else 0

    def constant(self, name: str, default: Any = None) -> Any:
        return getattr(self._lib, name, default)

    def _after_fork(self) -> None:
        """In a forked child: the parent's threads are gone and its locks may be held. The
        driver state is the parent's too: on the H200 a child reading through the parent's
        started session got no GPU, so the child starts NVML again for itself (nvmlInit is
        reference-counted; nothing of the parent's is shut down) and asks for fresh handles."""
        self._lock = threading.Lock()
        self._init_ended = threading.Condition(self._lock)
        self._worker = None
        self._stuck = []
        self._init_since = None
        self._caller = threading.local()
        self._status = None
        self._retry_at = 0.0
        self._handles = {}
        self._handle_index = {}


def _label(key: tuple[str, int | None]) -> str:
    name, index = key
    return name if index is None else f"{name} on GPU {index}"


def _safe_str(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        return type(exc).__name__
    return text if len(text) <= 300 else text[:299] + "…"


HUNG_FIX = ("If `nvidia-smi` hangs too, the driver is stuck: look for Xid errors in `dmesg`; the GPU may "
             "need a reset or the machine a reboot (administrator). gpunb keeps trying in the background.")

_SESSIONS: weakref.WeakSet[NvmlSession] = weakref.WeakSet()


def _reset_sessions_after_fork() -> None:
    for session in list(_SESSIONS):
        session._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_sessions_after_fork)


_default_lock = threading.Lock()
_default_session: NvmlSession | None = None


def default_session() -> NvmlSession:
    """The process-wide session. ``GPUNB_FAKE_NVML=<scenario>`` swaps in the recorded
    fake (tests and CI notebooks only; see ``gpunb.testing``)."""
    global _default_session
    with _default_lock:
        if _default_session is None:
            name = os.environ.get("GPUNB_FAKE_NVML")
            _default_session = _fake_session(name) if name else NvmlSession()
        return _default_session


def _fake_session(name: str) -> NvmlSession:
    from gpunb.testing.fake_nvml import SCENARIOS, scenario

    if name not in SCENARIOS:
        shown = name if len(name) <= 40 else name[:39] + "…"
        return NvmlSession(init_problem=NvmlStatus(
            False,
            f"GPUNB_FAKE_NVML={shown!r} names no recorded fake NVML scenario (known: {', '.join(SCENARIOS)}); "
            "that variable replaces the real GPUs with recorded readings, for gpunb's own tests.",
            "Unset GPUNB_FAKE_NVML to read the real GPUs (`%env GPUNB_FAKE_NVML=` does not unset it: "
            "use `del os.environ['GPUNB_FAKE_NVML']` and restart the kernel), or name a known scenario.",
        ))
    try:
        return NvmlSession(scenario(name))
    except ValueError as exc:  # GPUNB_FAKE_NVML_FROM_S unreadable
        return NvmlSession(init_problem=NvmlStatus(False, str(exc), "Unset it, or give seconds such as 4."))


def stop_default_worker() -> None:
    """End the process-wide session's worker thread if one runs (``%unload_ext``)."""
    with _default_lock:
        session = _default_session
    if session is not None:
        session.stop_worker()


def set_default_session(session: NvmlSession | None) -> None:
    """Replace the process-wide session (tests); ``None`` resets to the real library."""
    global _default_session
    with _default_lock:
        old, _default_session = _default_session, session
    if old is not None and old is not session:
        old.stop_worker()
