"""The server extension's work, apart from HTTP: build the GPU holders report off the event
loop, share it between close requests, and shut down an idle kernel that holds GPU memory.

One report is built at a time in a dedicated one-thread executor (NVML and ``/proc`` block;
a driver that hangs then delays only gpunb's endpoints, never the server's own executor or
its event loop), and a report younger than ``max_age_s`` is reused: a Prometheus scrape
and every notebook's monitor asking at once cost one NVML pass.

Each answer's body (JSON, metrics text) is made once per report, in a second one-thread
executor, never on the event loop: for 3,000 GPU processes that is ~80 ms of JSON and ~50 ms
of metrics text that would otherwise stall every other request of the server
(``benchmarks/server_scale.py`` measures Jupyter's own ``/api/status`` meanwhile).

The energy counters are read with the rest of the report, on the same NVML thread; each
kernel's share of its GPUs' energy is added there too (``analysis/holders/kernel_energy.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.holders.gpus import HoldersReport, build_report
from gpunb.analysis.holders.kernel_energy import KernelEnergyLedger
from gpunb.readings.gpu import GpuInfo, read_info
from gpunb.readings.nvml import NvmlSession, default_session
from gpunb.readings.server_kernels import read_server_kernels

REPORT_MAX_AGE_S = 1.0
REPORT_TIMEOUT_S = 10.0
BUSY_STATES = ("busy", "starting", "restarting")
EXIT_WAIT_S = 5.0


class Refusal(Exception):
    """An action gpunb will not take; ``status`` is the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ShutdownResult:
    kernel_id: str
    path: str
    execution_state: str  # before the shutdown
    held_bytes: dict[int, int]  # GPU index -> bytes the kernel held (NVML, before)
    used_before_bytes: dict[int, int | None]  # the device's used memory before and after
    used_after_bytes: dict[int, int | None]
    # what the GPU's other processes held before and after (NVML's per-process list), so the
    # memory that came back can be told apart from other processes starting or ending meanwhile
    others_before_bytes: dict[int, int] = field(default_factory=dict)
    others_after_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def freed_bytes(self) -> dict[int, int | None]:
        """Per GPU: the drop in used memory, net of other processes' change meanwhile."""
        out: dict[int, int | None] = {}
        for i, before in self.used_before_bytes.items():
            after = self.used_after_bytes.get(i)
            if before is None or after is None:
                out[i] = None
                continue
            drift = self.others_after_bytes.get(i, 0) - self.others_before_bytes.get(i, 0)
            out[i] = before - after + drift
        return out

    def to_dict(self) -> dict[str, Any]:
        key = lambda d: {str(k): v for k, v in sorted(d.items())}  # noqa: E731
        return {
            "kernel_id": self.kernel_id,
            "path": self.path,
            "execution_state_before": self.execution_state,
            "held_bytes": key(self.held_bytes),
            "memory_used_before_bytes": key(self.used_before_bytes),
            "memory_used_after_bytes": key(self.used_after_bytes),
            "other_processes_before_bytes": key(self.others_before_bytes),
            "other_processes_after_bytes": key(self.others_after_bytes),
            "freed_bytes": key(self.freed_bytes),
        }


class GpuReportService:
    """Reports for one Jupyter server (its kernel and session managers)."""

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any = None,
        *,
        nvml: NvmlSession | None = None,
        max_age_s: float = REPORT_MAX_AGE_S,
        timeout_s: float = REPORT_TIMEOUT_S,
        build: Callable[..., HoldersReport] = build_report,
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self._nvml = nvml
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self._build = build
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpunb-nvml")
        self._render_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpunb-render")
        self._rendered: dict[str, tuple[HoldersReport, asyncio.Future]] = {}  # body kind -> (report, body)
        self._infos: tuple[GpuInfo, ...] | None = None
        self._cached: tuple[float, HoldersReport] | None = None
        self._inflight: asyncio.Future | None = None
        self._energy = KernelEnergyLedger()  # used on the NVML thread only

    @property
    def nvml(self) -> NvmlSession:
        return self._nvml if self._nvml is not None else default_session()

    def _blocking_report(self, kernels: tuple) -> HoldersReport:
        nvml = self.nvml
        if self._infos is None and nvml.start().ok:  # static facts: once per server
            self._infos = tuple(read_info(nvml, i) for i in range(nvml.device_count()))
        # each kernel's share of its GPUs' energy since the last report (still on the NVML thread)
        return self._energy.account(self._build(nvml, kernels, infos=self._infos))

    async def report(self, *, fresh: bool = False) -> HoldersReport:
        """The current report (at most ``max_age_s`` old unless ``fresh``). Raises
        :class:`Refusal` (503) when NVML does not answer within ``timeout_s``."""
        now = time.monotonic()
        if not fresh and self._cached is not None and now - self._cached[0] < self.max_age_s:
            return self._cached[1]
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._new_report())
        try:
            return await asyncio.wait_for(asyncio.shield(self._inflight), self.timeout_s)
        except asyncio.TimeoutError:
            raise Refusal(503, f"the NVIDIA driver (NVML) did not answer within {self.timeout_s:g} s; "
                               "check `nvidia-smi` on the server machine") from None
        except Exception as exc:  # a bug or an odd host: say so in the answer, keep the server serving
            raise Refusal(500, f"gpunb could not read the GPUs and kernels ({type(exc).__name__}: {exc}); "
                               "the server log has details") from exc

    async def rendered(self, kind: str, render: Callable[[HoldersReport], Any]) -> Any:
        """``render(report)`` of the current report, made once per report off the event loop
        (concurrent requests for the same report share it). Raises :class:`Refusal` as
        :meth:`report` does."""
        report = await self.report()
        made = self._rendered.get(kind)
        if made is None or made[0] is not report or (made[1].done() and made[1].exception() is not None):
            loop = asyncio.get_running_loop()
            made = (report, asyncio.ensure_future(loop.run_in_executor(self._render_executor, render, report)))
            self._rendered[kind] = made
        try:
            return await asyncio.shield(made[1])
        except Exception as exc:
            raise Refusal(500, f"gpunb could not write its answer ({type(exc).__name__}: {exc}); "
                               "the server log has details") from exc

    async def _new_report(self) -> HoldersReport:
        kernels = await read_server_kernels(self.kernel_manager, self.session_manager)
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(self._executor, self._blocking_report, kernels)
        self._cached = (time.monotonic(), report)
        return report

    async def shutdown_idle_kernel(self, kernel_id: str, *, confirm: Any, force: bool = False) -> ShutdownResult:
        """Shut down one of this server's kernels that holds GPU memory, through the server's
        kernel manager. Refuses (``Refusal``): a kernel this server does not run (404), a
        missing or wrong confirmation (400), a busy kernel unless ``force`` (409), a kernel
        known to hold no GPU memory unless ``force`` (409)."""
        km = self.kernel_manager
        if kernel_id not in km:
            raise Refusal(404, f"no kernel {kernel_id} runs on this Jupyter server; gpunb shuts down only this "
                               "server's own kernels")
        if confirm != kernel_id:
            raise Refusal(400, 'confirmation missing: send {"confirm": "<the kernel id>"} to shut this kernel down '
                               "(its unsaved variables are lost)")
        report = await self.report(fresh=True)
        use = next((u for u in report.kernels if u.kernel.kernel_id == kernel_id), None)
        if use is None:  # shut down meanwhile
            raise Refusal(404, f"kernel {kernel_id} is gone from this Jupyter server")
        state = use.kernel.execution_state
        name = use.kernel.path or f"kernel {kernel_id}"
        if state in BUSY_STATES and not force:
            raise Refusal(409, f"{name} is {state}: a running cell would be lost. Wait until it is idle, or send "
                               '"force": true')
        if not use.gpu_bytes and not use.has_cuda_context and not force:
            raise Refusal(409, f"{name} holds no GPU memory, so shutting it down frees none; use the "
                               'Running tab (or send "force": true)')
        before = {d.index: d.memory_used_bytes for d in report.devices}
        result = km.shutdown_kernel(kernel_id)
        if inspect.isawaitable(result):
            await result
        after_report = await self._after_exit(use.gpu_pids)
        after = {d.index: d.memory_used_bytes for d in after_report.devices}
        touched = set(use.gpu_bytes) or set(before)
        return ShutdownResult(kernel_id, use.kernel.path, state, dict(use.gpu_bytes),
                              {i: before.get(i) for i in touched}, {i: after.get(i) for i in touched},
                              _others(report, use.gpu_pids, touched), _others(after_report, use.gpu_pids, touched))

    async def _after_exit(self, pids: tuple[int, ...]) -> HoldersReport:
        """A report read once NVML no longer lists ``pids`` (the driver frees an exited
        process's memory shortly after it exits), or after EXIT_WAIT_S."""
        deadline = time.monotonic() + EXIT_WAIT_S
        while True:
            report = await self.report(fresh=True)
            listed = {h.pid for h in report.holders()}
            if not listed.intersection(pids) or time.monotonic() >= deadline:
                return report
            await asyncio.sleep(0.2)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._render_executor.shutdown(wait=False, cancel_futures=True)


def _others(report: HoldersReport, pids: tuple[int, ...], gpus: set[int]) -> dict[int, int]:
    """Per GPU in ``gpus``: the memory NVML lists for processes other than ``pids``."""
    out = dict.fromkeys(gpus, 0)
    for h in report.holders():
        if h.gpu_index in out and h.pid not in pids and h.used_bytes is not None:
            out[h.gpu_index] += h.used_bytes
    return out
