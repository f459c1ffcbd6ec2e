"""An all-reduce across the GPUs, in subprocesses: one rank per GPU, never in the kernel.

Each rank runs ``allreduce_script.py`` with the kernel's interpreter and environment plus
NVLink multicast switched off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``: multicast can take a shared host's GPUs out of service). The ranks
meet through a file rendezvous (no TCP port to pick). They are started early, import torch
(seconds) while other work runs, and wait for :meth:`AllReduceLaunch.go`. From then a hard
deadline holds: a rank that has not finished by then is killed with its whole process group,
and the record says at which step each rank was, which is where a hang stands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SCRIPT = Path(__file__).with_name("allreduce_script.py")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIZES_MIB = (8, 64, 256, 1024)  # the sizes recorded on the H200 pair
TIMEOUT_S = 90.0  # from the start signal: NCCL start-up on 8 GPUs takes seconds, not minutes


@dataclass(frozen=True)
class AllReduceSize:
    bytes: int
    ms: float  # one all-reduce, the mean of ``iters`` back to back
    algbw_gbs: float
    busbw_gbs: float  # nccl-tests' bus bandwidth: algbw * 2 (n - 1) / n
    wrong: int  # elements whose sum was not the expected one, all ranks together


@dataclass
class AllReduceRun:
    """What the ranks reported; ``error`` says why the run did not complete."""

    backend: str
    world_size: int
    sizes: list[AllReduceSize] = field(default_factory=list)
    init_ms: float | None = None  # init_process_group and the first collective, on rank 0
    nccl_version: str | None = None
    error: str | None = None
    timed_out: bool = False
    last_step: dict[int, str] = field(default_factory=dict)  # rank -> the step it reached last
    rank_errors: dict[int, str] = field(default_factory=dict)
    duration_s: float = 0.0  # from the start signal to the end

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.sizes)

    @property
    def largest(self) -> AllReduceSize | None:
        return max(self.sizes, key=lambda s: s.bytes) if self.sizes else None

    @property
    def wrong(self) -> int:
        return sum(s.wrong for s in self.sizes)


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[str], stderr: IO[str]) -> None:
        self.rank = rank
        self.proc = proc
        self.stderr = stderr
        self.step = "starting"
        self.ready = threading.Event()
        self.error: str | None = None
        self.done = False
        self.lines: list[dict[str, Any]] = []
        self.reader: threading.Thread | None = None


class AllReduceLaunch:
    """``start()`` the ranks (they import torch), ``go()`` when the GPUs are free, ``wait()`` for
    the record. ``cancel()`` kills whatever still runs; every path ends in one of them."""

    def __init__(self, world_size: int, *, backend: str = "nccl", environ: Mapping[str, str] | None = None,
                 sizes_mib: Sequence[int] = SIZES_MIB, timeout_s: float = TIMEOUT_S, iters: int = 20,
                 warmup: int = 5, python: str | None = None) -> None:
        if world_size < 2:
            raise ValueError("an all-reduce needs at least 2 ranks")
        self.world_size = world_size
        self.backend = backend
        self.environ = dict(os.environ if environ is None else environ)
        self.sizes_mib = tuple(sizes_mib)
        self.timeout_s = timeout_s
        self.iters, self.warmup = iters, warmup
        self.python = python or sys.executable
        self._ranks: list[_Rank] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._go_at: float | None = None
        self._start_error: str | None = None

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> AllReduceLaunch:
        self._dir = tempfile.TemporaryDirectory(prefix="gpunb-allreduce-")
        rendezvous = Path(self._dir.name) / "rendezvous"
        env = {**self.environ, **NO_MULTICAST, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        for rank in range(self.world_size):
            cmd = [self.python, str(SCRIPT), f"--rank={rank}", f"--world={self.world_size}",
                   f"--init=file://{rendezvous}", f"--backend={self.backend}",
                   "--sizes=" + ",".join(map(str, self.sizes_mib)), f"--iters={self.iters}",
                   f"--warmup={self.warmup}", f"--timeout={max(10.0, self.timeout_s - 5.0):.0f}"]
            # stderr to a file: a chatty NCCL must not fill a pipe and stall the rank
            stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed when the rank is reaped)
            try:
                # its own session: a kill reaches everything the rank started
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                        env=env, start_new_session=True)
            except OSError as exc:
                stderr.close()
                self._start_error = f"could not start {cmd[0]}: {exc}"
                self.cancel()
                return self
            r = _Rank(rank, proc, stderr)
            self._ranks.append(r)
            r.reader = threading.Thread(target=self._read, args=(r,), name=f"gpunb-allreduce-{rank}", daemon=True)
            r.reader.start()
        return self

    def go(self) -> None:
        """Let the ranks start CUDA and measure (the GPUs are free now); the deadline starts."""
        self._go_at = time.monotonic()
        for r in self._ranks:
            self._send(r, "go\n")

    def cancel(self) -> None:
        for r in self._ranks:
            self._kill(r)
        self._cleanup()

    def wait(self) -> AllReduceRun:
        """Wait for every rank (at most ``timeout_s`` after :meth:`go`), kill what is left, and
        return the record."""
        run = AllReduceRun(self.backend, self.world_size)
        if self._start_error:
            run.error = self._start_error
            return run
        if self._go_at is None:
            self.go()
        go_at = self._go_at if self._go_at is not None else time.monotonic()
        deadline = go_at + self.timeout_s
        while True:
            codes = [r.proc.poll() for r in self._ranks]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break  # all done, or one died (the others would wait for it forever)
            if time.monotonic() >= deadline:
                run.timed_out = True
                break
            time.sleep(0.05)
        for r in self._ranks:
            if r.proc.poll() is None:
                self._kill(r)
            r.proc.wait()
        for r in self._ranks:  # the last lines may still sit in the pipe after the exit
            if r.reader is not None:
                r.reader.join(timeout=5.0)
        run.duration_s = time.monotonic() - go_at
        self._fold(run)
        self._cleanup()
        return run

    # -- helpers -------------------------------------------------------------------------------
    def _read(self, r: _Rank) -> None:
        assert r.proc.stdout is not None
        for line in r.proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # a library printed to stdout
            event = msg.get("event")
            if event == "step":
                r.step = msg.get("step", r.step)
            elif event == "ready":
                r.ready.set()
            elif event == "error":
                r.error = msg.get("error", "")
            elif event == "done":
                r.done = True
            r.lines.append(msg)

    def _send(self, r: _Rank, text: str) -> None:
        try:
            assert r.proc.stdin is not None
            r.proc.stdin.write(text)
            r.proc.stdin.close()
        except (OSError, ValueError):  # the rank is gone already; wait() reports it
            pass

    def _kill(self, r: _Rank) -> None:
        if r.proc.poll() is not None:
            return
        try:
            os.killpg(r.proc.pid, signal.SIGKILL)  # the rank's session: its pid is the group id
        except (ProcessLookupError, PermissionError):
            try:
                r.proc.kill()
            except OSError:
                pass

    def _fold(self, run: AllReduceRun) -> None:
        for r in self._ranks:
            run.last_step[r.rank] = r.step
            if r.error:
                run.rank_errors[r.rank] = r.error
            for msg in r.lines:
                if msg.get("event") == "result" and r.rank == 0:
                    run.sizes.append(AllReduceSize(int(msg["bytes"]), float(msg["ms"]), float(msg["algbw_gbs"]),
                                                   float(msg["busbw_gbs"]), int(msg["wrong"])))
                elif msg.get("event") == "init" and r.rank == 0:
                    run.init_ms = msg.get("ms")
                    run.nccl_version = msg.get("nccl_version")
        if run.timed_out:
            stuck = "; ".join(f"rank {k}: {v}" for k, v in sorted(run.last_step.items()))
            run.error = f"not finished within {self.timeout_s:.0f} s (killed); where each rank was: {stuck}"
            return
        died = [r for r in self._ranks if not r.done]
        if died:
            parts = []
            for r in died:
                cause = r.error or self._stderr_tail(r) or f"exit code {r.proc.returncode}"
                parts.append(f"rank {r.rank} at '{r.step}': {cause}")
            run.error = "; ".join(parts)
        elif not run.sizes:
            run.error = "no size fitted in the GPUs' free memory"

    def _stderr_tail(self, r: _Rank) -> str:
        try:
            r.stderr.seek(0)
            lines = [ln for ln in r.stderr.read().strip().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return " | ".join(lines[-3:])

    def _cleanup(self) -> None:
        for r in self._ranks:
            try:
                r.stderr.close()
            except OSError:
                pass
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def run_allreduce(world_size: int, **kwargs: Any) -> AllReduceRun:
    """Start the ranks, measure at once, and return the record (see :class:`AllReduceLaunch`)."""
    return AllReduceLaunch(world_size, **kwargs).start().wait()
