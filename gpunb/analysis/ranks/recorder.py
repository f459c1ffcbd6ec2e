"""Inside each worker process of a profiled multi-GPU cell: time the steps, note the memory,
and leave a small record for the kernel.

A ``%%gpuprofile`` cell opens a *rank channel* (``rank_channel.py``): a directory named by
``GPUNB_RANK_CHANNEL`` in the environment. Every process the cell starts finds it:

- **forked** children (``accelerate.notebook_launcher``, ``torch.multiprocessing`` with fork)
  start here through ``os.register_at_fork``: they inherit the kernel's profiling hooks, which
  are taken out, and get their own;
- **fresh interpreters** (torchrun, spawn) start here from the ``sitecustomize`` the channel
  puts first on ``PYTHONPATH`` (``boot/``), once they import torch.

Each records what ``%%gpuprofile`` records for its steps, and nothing that changes what the
code does: torch's global optimizer-step hook with CUDA events (``instruments.py``, the same
per-step cost as a profiled cell, under 1 %) and the DataLoader wait. It writes
``rank-<pid>.json`` at most every 2 s at a step end (and after step 12, when DDP's own timing
of iterations 1-10 is there), and once more when the process exits, so even a killed rank
leaves what it had. Ranks that never take an optimizer step (DataLoader workers, the torchrun
agent) write nothing.

Communication vs compute comes from DDP's own runtime statistics
(``DistributedDataParallel._get_ddp_logging_data()``: CUDA-event times of the forward, the
backward computation and the gradient all-reduce, and their overlap, which DDP records on
iterations 1-10 and every 100th); the instances are noted as they are built, and read after
each of the first steps and at each flush (tens of µs each). Peak memory comes
from the rank's allocator and from NVML's per-process list, read in a thread once a second.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import weakref
from itertools import pairwise
from typing import Any

from gpunb.analysis.ranks.channel_dir import ChannelWriter, from_environ
from gpunb.analysis.steps.instruments import Instruments
from gpunb.readings import torch_state

FLUSH_EVERY_S = 2.0
FLUSH_AT_STEP = 12  # DDP times iterations 1-10 (and every 100th): their figures exist by then
KEEP_STEPS = 4096  # step times kept per rank (the most recent ones)
NVML_EVERY_S = 1.0

_active: RankRecorder | None = None  # this process's recorder
_kernel_instruments: Instruments | None = None  # a profiled cell's hooks in the kernel (rank_channel.py)
_fork_handler_registered = False


class RankInstruments(Instruments):
    """The step hook and the DataLoader wait of :class:`Instruments`; no tensor-sync or output
    wrappers (the report of a multi-GPU cell does not use them). Flushes the record as due."""

    def __init__(self, torch: Any, recorder: RankRecorder) -> None:
        super().__init__(torch, memory_every_s=None)
        self._thread = None  # a worker process has no cell: its steps count from any thread
        self.recorder = recorder

    def install(self, cuda: bool) -> None:
        torch = self.torch
        self.installed = True
        if cuda:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()
        self._hook_optimizer(torch)
        self._wrap_dataloader(torch)
        self._note_ddp(torch)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        before = len(self.step_t)
        super()._on_step(optimizer, args, kwargs)
        n = len(self.step_t)
        if n == before:  # a second optimizer's step
            return
        rec = self.recorder
        if n == 1:
            rec.arm_exit()
        if n < FLUSH_AT_STEP and rec.ddp:  # DDP times each of its first iterations: keep every one
            rec.read_ddp()
        if n == FLUSH_AT_STEP or self.step_t[-1] - rec.flushed_at >= FLUSH_EVERY_S:
            rec.flush()

    def _note_ddp(self, torch: Any) -> None:
        parallel = getattr(getattr(torch, "nn", None), "parallel", None)
        ddp = getattr(parallel, "DistributedDataParallel", None)
        if ddp is None:
            return
        original = ddp.__dict__.get("__init__")
        if original is None:
            return
        seen = self.recorder.ddp

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:
            __tracebackhide__ = True
            original(module, *args, **kwargs)
            seen.add(module)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        ddp.__init__ = __init__
        self._undo.append(lambda: setattr(ddp, "__init__", original))


def _rank_from_env() -> dict[str, Any]:
    def num(name: str) -> int | None:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    return {"rank": num("RANK"), "local_rank": num("LOCAL_RANK"), "world_size": num("WORLD_SIZE")}


class RankRecorder:
    """One worker process's measurements and its record file."""

    def __init__(self, torch: Any, channel: str, launcher: str, channel_id: str | None = None) -> None:
        self.torch = torch
        self.channel = channel
        self.launcher = launcher
        self.pid = os.getpid()
        self.name = f"rank-{self.pid}.json"
        self.path = os.path.join(channel, self.name)
        self.writer = ChannelWriter(channel, channel_id)  # the private directory, opened once (channel_dir.py)
        if not self.writer.open:
            raise LookupError(f"{channel} is not the profiled cell's private directory: nothing is recorded")
        self.group: dict[str, Any] | None = None  # the torch.distributed process group this process joined
        self.t0 = time.perf_counter()
        self.flushed_at = self.t0
        self.ddp: weakref.WeakSet[Any] = weakref.WeakSet()
        self.ddp_stats: dict[str, Any] | None = None
        self.ddp_samples: dict[int, dict[str, Any]] = {}  # DDP iteration -> its timing
        self.identity = _rank_from_env()
        self.backend: str | None = None
        self.device: int | None = None
        self.gpu: dict[str, Any] = {}
        self.nvml_peak: int | None = None
        self._nvml_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._exit_armed = False
        self.finished = False
        self.instruments = RankInstruments(torch, self)
        self.instruments.install(torch_state.cuda_initialized(torch))

    # -- exit --------------------------------------------------------------------------------
    def arm_exit(self) -> None:
        """Flush once more when the process ends. Registered at the first step: a forked
        multiprocessing child clears the finalizers it inherited only after the fork, and ends
        through them (``os._exit`` skips ``atexit``)."""
        if self._exit_armed:
            return
        self._exit_armed = True
        atexit.register(self.finish)
        try:
            from multiprocessing import util

            util.Finalize(self, RankRecorder.finish, args=(self,), exitpriority=100)
        except Exception:  # noqa: BLE001 (atexit still covers fresh interpreters)
            pass

    def finish(self) -> None:
        """The last record: every step's GPU time read back (waits for the GPU once)."""
        if self.finished or os.getpid() != self.pid:
            return
        self.finished = True
        self._stop.set()
        try:
            self.instruments.finish_steps()
        except Exception:  # noqa: BLE001 (a broken context: the host times stand)
            pass
        if self.device is not None:
            self._read_nvml()  # a short run may end before the thread's first reading
        self.flush(final=True)

    def detach(self) -> None:
        """In a forked child of this process: take the hooks out, write nothing."""
        self.finished = True
        self.instruments.remove()
        self.writer.close()

    # -- the record ------------------------------------------------------------------------
    def _learn_identity(self) -> None:
        torch = self.torch
        if self.identity.get("rank") is None:  # a launcher may set RANK after the fork (torch elastic)
            self.identity = {**self.identity, **{k: v for k, v in _rank_from_env().items() if v is not None}}
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.identity.update(rank=dist.get_rank(), world_size=dist.get_world_size())
                self.backend = str(dist.get_backend())
                if self.group is None:  # joined a process group: what makes a fresh interpreter a rank
                    master = ":".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT")).strip(":")
                    self.group = {"backend": self.backend, "world_size": self.identity["world_size"],
                                  "rendezvous": master}
        except Exception:  # noqa: BLE001 (a group being torn down)
            pass
        if self.device is None and torch_state.cuda_initialized(torch):
            try:
                self.device = torch_state.current_device(torch)
                props = torch.cuda.get_device_properties(self.device)
                self.gpu = {"uuid": torch_state.device_uuid(torch, self.device), "name": str(props.name),
                            "total_bytes": int(props.total_memory)}
            except Exception:  # noqa: BLE001
                self.device = None
            if self.device is not None:
                self._start_nvml()

    def read_ddp(self) -> None:
        """DDP's timing of its latest sampled iteration, kept per iteration; the record gives their
        mean over every sampled iteration after the first (which pays the warm-up)."""
        for module in list(self.ddp):
            getter = getattr(module, "_get_ddp_logging_data", None)
            if getter is None:
                continue
            try:
                data = getter()
            except Exception:  # noqa: BLE001 (a private API: another torch may lack it)
                continue
            iteration = data.get("iteration")
            if not iteration:
                continue

            def ms(key: str, data: Any = data) -> float | None:
                value = data.get(key)
                return value / 1e6 if isinstance(value, (int, float)) else None

            self.ddp_samples[int(iteration)] = {
                "forward_ms": ms("forward_compute_time"), "backward_compute_ms": ms("backward_compute_time"),
                "backward_comm_ms": ms("backward_comm_time"), "overlap_ms": ms("backward_compute_comm_overlap_time")}
            break  # the first DDP model that has timed an iteration: the one being trained
        usable = {i: v for i, v in self.ddp_samples.items() if i > 1} or dict(self.ddp_samples)
        if not usable:
            return
        mean = {}
        for key in ("forward_ms", "backward_compute_ms", "backward_comm_ms", "overlap_ms"):
            values = [v[key] for v in usable.values() if v[key] is not None]
            mean[key] = sum(values) / len(values) if values else None
        self.ddp_stats = {"iteration": max(usable), "iterations": sorted(usable), **mean, "instances": len(self.ddp)}

    def _start_nvml(self) -> None:
        if self._nvml_thread is not None:
            return
        thread = threading.Thread(target=self._watch_nvml, name="gpunb-rank-nvml", daemon=True)
        self._nvml_thread = thread
        thread.start()

    def _read_nvml(self) -> None:
        """This process's memory as NVML lists it now (context, NCCL and cuDNN workspaces too);
        never CUDA. The GPU is found once, by the UUID torch gives (CUDA is up here)."""
        try:
            from gpunb.readings.devices import kernel_pids, read_device_map, read_ownership
            from gpunb.readings.nvml import default_session

            nvml = default_session()
            if "nvml_index" not in self.gpu and self.device is not None:
                self.gpu["nvml_index"] = read_device_map(nvml, torch=self.torch).nvml_index(self.device)
            index = self.gpu.get("nvml_index")
            if index is None:
                return
            own = read_ownership(nvml, index, torch=self.torch, pids=kernel_pids(), names=False)
            if own.self_bytes is not None and (self.nvml_peak is None or own.self_bytes > self.nvml_peak):
                self.nvml_peak = own.self_bytes
        except Exception:  # noqa: BLE001 (NVML trouble costs this figure only)
            return

    def _watch_nvml(self) -> None:
        while not self._stop.is_set():
            self._read_nvml()
            self._stop.wait(NVML_EVERY_S)

    def _recent_steps(self) -> tuple[list[float], float | None, str]:
        """The last KEEP_STEPS step times (GPU time where events cover them), the first step's,
        and their source. Only the recent part is worked out: a flush must not cost more as a
        run gets longer."""
        ins = self.instruments
        n = len(ins.step_t)
        first = max(0, n - KEEP_STEPS)
        marks = [ins.step_t[first - 1] if first else self.t0, *ins.step_t[first:]]
        host_ms = [(b - a) * 1e3 for a, b in pairwise(marks)]
        spans = []
        for lo, hi, ms in reversed(ins.step_spans):  # in step order: stop at the first one too old
            if lo < first:
                break
            spans.append((lo - first, hi - first, ms))
        if not spans:
            return host_ms, (host_ms[0] if host_ms and not first else None), "host clock"
        from gpunb.analysis.steps.events import per_step_ms

        step_ms = per_step_ms(spans[::-1], host_ms)
        spans0 = ins.step_spans[0]
        first_ms = spans0[2] if spans0[:2] == (0, 0) else (step_ms[0] if not first else None)
        return step_ms, first_ms, "CUDA events"

    def record(self, final: bool) -> dict[str, Any]:
        ins = self.instruments
        self._learn_identity()
        self.read_ddp()
        step_ms, first_ms, source = self._recent_steps()
        peak = None
        if self.device is not None:
            try:
                peak = torch_state.read_allocator(self.torch, self.device)
            except Exception:  # noqa: BLE001
                peak = None
        now = time.perf_counter()
        return {
            "version": 1, "pid": self.pid, "ppid": os.getppid(), "host": socket.gethostname(),
            "launcher": self.launcher, **self.identity, "backend": self.backend,
            "device": self.device, "gpu": self.gpu,
            "steps": len(ins.step_t), "first_step_ms": first_ms,
            "step_ms": step_ms, "step_ms_offset": len(ins.step_t) - len(step_ms), "source": source,
            "batches": ins.fetch_n, "data_wait_s": ins.fetch_s, "batch_size": ins.batch_size,
            "first_batch_s": (ins.first_fetch_t - self.t0) if ins.first_fetch_t is not None else None,
            "last_step_s": (ins.step_t[-1] - self.t0) if ins.step_t else None, "wall_s": now - self.t0,
            "started_unix": time.time() - (now - self.t0),
            "peak_allocated_bytes": peak.peak_allocated_bytes if peak else None,
            "peak_reserved_bytes": peak.peak_reserved_bytes if peak else None,
            "nvml_peak_bytes": self.nvml_peak, "ddp": self.ddp_stats, "final": final, "group": self.group,
        }

    def flush(self, final: bool = False) -> None:
        """Write the record (atomically, into the private directory only: ``channel_dir``);
        nothing before the first step, nothing once the channel is gone (the cell ended)."""
        self.flushed_at = time.perf_counter()
        if not self.instruments.step_t or not self.writer.usable():
            return
        try:
            self.writer.write(self.name, json.dumps(self.record(final)))
        except Exception:  # noqa: BLE001 (the user's training must not notice)
            pass


# -- starting in a worker ----------------------------------------------------------------------

def start(channel: str, launcher: str, channel_id: str | None = None) -> RankRecorder | None:
    """Record this process's steps into ``channel`` (the directory whose identity is
    ``channel_id``): now if torch is imported, else as soon as it is. Returns the recorder when
    it started now; None also when ``channel`` is not the cell's private directory."""
    global _active
    _register_fork_handler()
    torch = torch_state.imported_torch()
    if torch is None:
        from gpunb.readings.import_watch import when_imported


        def start_then(module: Any) -> None:
            start(channel, launcher, channel_id)

        when_imported("torch", start_then)
        return None
    if _active is not None and not _active.finished and _active.pid == os.getpid():
        return _active
    try:
        _active = RankRecorder(torch, channel, launcher, channel_id)
    except Exception:  # noqa: BLE001 (never break the user's process; LookupError: not the cell's directory)
        _active = None
    return _active


def boot() -> None:
    """From ``boot/sitecustomize.py``, once a fresh interpreter has imported torch."""
    found = from_environ()
    if found:
        start(found[0], "fresh interpreter", found[1])


def set_kernel_instruments(instruments: Instruments | None) -> None:
    """The profiled cell's hooks in the kernel (None when it ends): a forked child takes them
    out and records its own steps instead."""
    global _kernel_instruments
    _kernel_instruments = instruments
    if instruments is not None:
        _register_fork_handler()


def _after_fork_in_child() -> None:
    global _active, _kernel_instruments
    inherited, kernel = _active, _kernel_instruments
    _active = _kernel_instruments = None
    try:
        if inherited is None and kernel is None:
            return  # no profiled cell here: this fork is none of gpunb's business
        if inherited is not None:
            inherited.detach()
        if kernel is not None:
            kernel.remove()
        from gpunb.readings.nvml import set_default_session

        set_default_session(None)  # the parent's NVML session is not this process's
        found = from_environ()
        if found:
            start(found[0], "fork", found[1])
    except Exception:  # noqa: BLE001 (a fork must never fail because of gpunb)
        pass


def _register_fork_handler() -> None:
    global _fork_handler_registered
    if not _fork_handler_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


def active() -> RankRecorder | None:
    return _active if _active is not None and _active.pid == os.getpid() else None

