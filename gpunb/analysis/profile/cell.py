"""One profiled cell: start the instruments, stop them, and turn what they saw into a
:class:`CellProfile` record (with its verdict and advice).

Used by ``%%gpuprofile`` and by the API twin ``with gpunb.profile() as p:`` (in
:mod:`gpunb.shells.api`); the records live in :mod:`gpunb.analysis.profile.records`.

Peak VRAM: torch's allocator keeps ONE global peak counter per device. A profiled cell
resets it at the start (``torch.cuda.reset_peak_memory_stats``) so the peak is the cell's;
code that reads ``torch.cuda.max_memory_allocated()`` across cells sees the reset too.
``reset_peak=False`` (``--no-reset``) leaves the counter alone; the peak is then only
reported when it grew during the cell.

A closer look at a few steps (``step_plan.py``): the FLOPs of step 2 are counted (on by
default, ``flops=False`` turns it off) and, with ``ops=True``, steps 4-6 are traced by
torch.profiler into a Chrome/Perfetto trace in ``trace_dir`` (default: the working
directory, which in Jupyter is the notebook's). The steps they slow are left out of the
step times.

The leak finder (``leak=True``, the default; ``analysis/leaks``) takes a few censuses of
``namespace`` (the notebook's variables) at step ends after the warm-up, within 0.5 % of the
cell's time, and reports memory that grows with every step with the variable that holds it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from gpunb.analysis.advice import ranked
from gpunb.analysis.leaks.finder import LeakFinder, leak_advice
from gpunb.analysis.profile.cell_energy import CellMeters, check_energy_options, with_energy
from gpunb.analysis.profile.nvml_end import DeviceUsedReader, NvmlEnd, device_now, read_nvml_end, unread_nvml_end
from gpunb.analysis.profile.rank_verdict import judge_ranks
from gpunb.analysis.profile.records import CellProfile, GpuPart, StepStats, TimeShares
from gpunb.analysis.profile.throughput import assess
from gpunb.analysis.profile.verdict import judge
from gpunb.analysis.ranks.channel import RankChannel
from gpunb.analysis.ranks.summary import TrafficMeter, build_ranks
from gpunb.analysis.steps.events import per_step_ms
from gpunb.analysis.steps.instruments import TIMELINE_EVERY_S, Instruments
from gpunb.analysis.steps.plan import StepPlan
from gpunb.analysis.steps.records import OpsReport
from gpunb.readings import torch_state
from gpunb.readings.devices import read_device_map
from gpunb.readings.gpu_activity import UtilWindow, now_us
from gpunb.readings.interrupts import deferred_sigint
from gpunb.readings.nvml import NvmlSession, default_session, is_available
from gpunb.readings.peak_cache import lookup_noted as measured_peaks
from gpunb.readings.process import read_process_usage, reset_peak_rss


def _percentile(sorted_values: list[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class ProfileSession:
    """Measures everything between :meth:`start` and :meth:`stop` in this process."""

    def __init__(self, *, label: str = "", cell: int | None = None, warmup_steps: int = 1,
                 reset_peak: bool = True, timeline: bool = True, nvml: NvmlSession | None = None,
                 flops: bool = True, ops: bool = False, trace_dir: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None, ranks: bool = True, energy: bool = True,
                 tokens_per_sample: int | None = None, leak: bool = True,
                 namespace: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None) -> None:
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        for name, value in (("flops", flops), ("ops", ops), ("leak", leak)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        check_energy_options(energy, tokens_per_sample)
        self.energy = energy  # meter the GPUs' energy and link traffic (cell_energy.py)
        self.tokens_per_sample = tokens_per_sample
        self.meters: CellMeters | None = None
        if trace_dir is not None and not isinstance(trace_dir, (str, os.PathLike)):
            raise TypeError(f"trace_dir must be a directory path, got {type(trace_dir).__name__}")
        self.flops = flops
        self.ops = ops
        self.trace_dir = trace_dir
        self.environ = environ
        self.plan: StepPlan | None = None
        self.label = label
        self.cell = cell
        self.warmup_steps = warmup_steps
        self.reset_peak = reset_peak
        self.timeline = timeline
        self.nvml = nvml
        self.ranks = ranks  # also profile the worker processes the cell starts (rank_channel.py)
        self.channel: RankChannel | None = None
        self.traffic: TrafficMeter | None = None
        self.instruments: Instruments | None = None
        self.result: CellProfile | None = None
        self.leak = leak
        self.namespace = namespace  # the variables the leak finder looks at (a mapping, or a function giving one)
        self.leaks: LeakFinder | None = None

    def start(self) -> ProfileSession:
        """Install the cell's instruments, all or nothing: any exception on the way (a Ctrl-C
        too) takes out what went in before it goes on."""
        try:
            with deferred_sigint():  # a real Ctrl-C waits the few ms until start is done
                return self._start()
        except BaseException:
            self.abort()
            raise

    def _start(self) -> ProfileSession:
        torch: Any = torch_state.imported_torch()  # the module, or None (then cuda is False)
        self.torch = torch
        self.cuda_at_start = cuda = torch_state.cuda_initialized(torch)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        self.rss_reset = reset_peak_rss()
        self.before_alloc = None
        if cuda:
            try:
                dev = torch_state.current_device(torch)
                self.before_alloc = torch_state.read_allocator(torch, dev)
                if self.reset_peak:
                    torch.cuda.reset_peak_memory_stats(dev)
            except Exception:  # a sticky CUDA error from an earlier cell: measure the host side only
                self.cuda_at_start = cuda = False
        self.util_since_us = now_us()
        self.instruments = Instruments(torch, memory_every_s=TIMELINE_EVERY_S if self.timeline else None)
        if cuda:
            self.instruments.device_used = self._device_used_probe(torch)
        if (self.flops or self.ops) and torch is not None:
            self._plan_steps(torch)
        self.usage0 = read_process_usage()
        self.t0 = self.usage0.t_s
        if self.energy:
            self._start_meters()
        if torch is not None:
            self._watch_leaks(torch)
        else:  # the cell imports torch itself: plan the closer look and watch for leaks then
            self.instruments.on_torch_import = self._torch_imported
        self.instruments.install(cuda)
        if self.ranks:
            self.traffic = TrafficMeter(self.nvml or default_session())
            self.channel = RankChannel()  # kept before it opens: closing undoes a half-done open
            with deferred_sigint():
                self.channel.open(self.instruments)
        return self

    def _start_meters(self) -> None:
        """The energy counters of every GPU (the cell's are known at its end) and PCIe of the
        kernel's GPU, read in the background; the step hook feeds them marks."""
        assert self.instruments is not None
        used = self.instruments.device_used
        self.meters = CellMeters(self.nvml or default_session(),
                                 used.index if isinstance(used, DeviceUsedReader) else None, self.torch)
        self.instruments.step_meter = self.meters.at_step

    def _torch_imported(self, torch: Any) -> None:
        if self.flops or self.ops:
            self._plan_steps(torch)
        self._watch_leaks(torch)

    def _watch_leaks(self, torch: Any) -> None:
        if not self.leak or self.namespace is None:
            return
        namespace = self.namespace
        self.leaks = LeakFinder(torch, namespace if callable(namespace) else lambda: namespace,
                                warmup_steps=self.warmup_steps, t0=self.t0)
        assert self.instruments is not None
        self.instruments.leak_watch = self.leaks.on_step

    def _plan_steps(self, torch: Any) -> None:
        self.plan = StepPlan(torch, flops=self.flops, trace_path=self._trace_path() if self.ops else None)
        assert self.instruments is not None
        self.instruments.step_watch = self.plan.on_step

    def abort(self) -> None:
        """Take every hook out without building a report (after a failure of gpunb's own, a
        Ctrl-C in start or stop, or when the cell could not be profiled). Idempotent; each
        part is taken out even when another one fails."""
        with deferred_sigint():
            for part in (self._abort_instruments, self._abort_channel, self._abort_plan, self._abort_watchers):
                try:
                    part()
                except BaseException:  # noqa: BLE001 (the other parts must still come out)
                    pass

    def _abort_watchers(self) -> None:
        # the leak finder reads the notebook's variables: an aborted session must not keep them;
        # the energy meters have nothing of the user's, they are only dropped
        self.leaks = None
        self.meters = None

    def _abort_instruments(self) -> None:
        if self.instruments is not None:
            self.instruments.remove()

    def _abort_channel(self) -> None:
        channel = self.channel
        if channel is not None:
            channel.close()
            self.channel = None

    def _abort_plan(self) -> None:
        plan, self.plan = self.plan, None
        if plan is not None:
            plan.abandon()

    def _trace_path(self) -> Path:
        """Next to the notebook (the kernel's working directory), named by cell and time."""
        cell = f"cell{self.cell}-" if self.cell is not None else ""
        name = f"gpuprofile-{cell}{time.strftime('%Y%m%d-%H%M%S')}.pt.trace.json"
        return Path(self.trace_dir if self.trace_dir is not None else os.getcwd()) / name

    def stop(self, error: BaseException | None = None) -> CellProfile:
        """End the measurement (call once, also when the cell raised) and build the record.
        Whatever happens on the way (a Ctrl-C too), every hook is out when it returns or raises."""
        try:
            return self._stop(error)
        except BaseException:
            self.abort()
            raise

    def _stop(self, error: BaseException | None) -> CellProfile:
        ins = self.instruments
        assert ins is not None, "stop() before start()"
        t_end = time.perf_counter()
        with deferred_sigint():
            ins.remove()
            channel = self.channel
            records = channel.close() if channel is not None else []
            rank_notes = channel.notes if channel is not None else []
            self.channel = None  # only now: a Ctrl-C inside close() leaves it for abort() to close
        plan = self.plan
        if plan is not None:
            plan.stop_counting()  # before gpunb's own end-of-cell work could be counted
        torch = self.torch = ins.torch  # the cell may have imported torch itself
        cuda = torch_state.cuda_initialized(torch)
        nvml = self.nvml or default_session()
        # NVML's end-of-cell readings (the slowest is the utilization-sample buffer, ~2 ms) in
        # one trip to the NVML worker, begun now: they go on while the GPU finishes below
        end_reads = nvml.run_soon(read_nvml_end, nvml, torch if cuda else None, device_now(torch, cuda),
                                  self.util_since_us, fallback=unread_nvml_end, what="the cell's end readings")
        synced = gpu_time = None
        end_event = None
        if cuda:
            try:
                end_event = torch.cuda.Event(enable_timing=True)
                end_event.record()
                torch.cuda.synchronize()  # every stream, not only the current one
                synced = time.perf_counter() - self.t0
                ins.finish_steps()
                if ins.start_event is not None:
                    gpu_time = ins.start_event.elapsed_time(end_event) / 1000.0
            except Exception as exc:  # a sticky CUDA error (illegal address...) from the user's cell
                synced = None
                error = error or exc
        ins.sample_memory(force=True)
        if self.leaks is not None:
            self.leaks.finish(len(ins.step_t), time.perf_counter())
        usage = read_process_usage(peak_was_reset=self.rss_reset)
        ops = plan.finish() if plan is not None else None  # after the GPU finished: the trace is complete
        if ops is None and self.ops and torch is None:
            ops = OpsReport(False, (), 0.0, {}, (), (), "", None, 0.0,
                            "torch was not imported when the cell started, so there was nothing to trace")
        steps = self._steps(ins, plan.excluded if plan is not None else set())
        shares = self._shares(ins, t_end)
        nvml_end = end_reads.result()
        if isinstance(ins.device_used, DeviceUsedReader):  # the reading the last timeline point asked for
            ins.note_device_used(ins.device_used.last())
        gpu, absent = self._gpu_part(torch, nvml_end, nvml) if cuda else (None, self._why_no_gpu(torch))
        visible = ""
        driver_cuda = None
        if nvml_end.count:
            visible = str(nvml_end.name) if is_available(nvml_end.name) else "an NVIDIA GPU"
            driver_cuda = nvml_end.driver_cuda if is_available(nvml_end.driver_cuda) else None
        build = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
        profile = CellProfile(
            label=self.label,
            cell=self.cell,
            started=self.started,
            wall_s=t_end - self.t0,
            synced_wall_s=synced,
            gpu_time_s=gpu_time,
            cpu_s=usage.cpu_s - self.usage0.cpu_s,
            peak_rss_bytes=usage.peak_rss_bytes,
            peak_rss_is_cell=usage.peak_since_reset,
            steps=steps,
            shares=shares,
            gpu=gpu,
            gpu_absent=absent,
            gpu_visible=visible,
            torch_version=getattr(torch, "__version__", None) if torch is not None else None,
            torch_cuda=build,
            matmul_precision=torch_state.matmul_precision(torch) if torch is not None else None,
            param_devices=tuple(sorted(ins.param_device_types)),
            param_dtypes=tuple(sorted(ins.param_dtypes)),
            param_count=ins.param_count,
            optimizers=ins.optimizers,
            memory_timeline=tuple((t - self.t0, a, r) for t, a, r in ins.memory),
            step_marks_s=tuple(t - self.t0 for t in ins.step_t),
            error=_describe(error) if error is not None else "",
            flops=self._throughput(plan, steps, gpu, torch) if plan is not None and self.flops else None,
            ops=ops,
            driver_cuda=driver_cuda,
            other_thread_steps=ins.other_thread_steps,
            leak=self.leaks.report(ins.memory, ins.step_t, gpu.end_allocated_bytes if gpu is not None else None,
                                   self.warmup_steps) if self.leaks is not None else None,
        )
        self.leaks = None  # it reads the notebook's variables: let go of them with the cell
        verdict, advice = judge(profile)
        advice = ranked(list(advice) + leak_advice(profile.leak))
        part = build_ranks(records, warmup_steps=self.warmup_steps, nvml=nvml,
                           traffic=self.traffic.moved() if self.traffic is not None else None,
                           notes=rank_notes) if records else None
        if part is not None:
            rank_verdict, rank_advice = judge_ranks(part)
            if verdict.kind == "none":  # the training ran in the workers, not in the kernel
                verdict = rank_verdict
            advice = ranked(list(advice) + rank_advice)
        profile = dataclasses.replace(profile, verdict=verdict, advice=tuple(advice), ranks=part)
        if self.meters is not None:  # energy and link traffic on the GPUs the cell used (cell_energy.py)
            profile = with_energy(profile, self.meters, warmup_steps=self.warmup_steps, torch=self.torch,
                                  tokens_given=self.tokens_per_sample, tokens_seen=ins.sequence_length,
                                  cell_t0=self.t0)
        self.result = profile
        return self.result

    def _device_used_probe(self, torch: Any) -> DeviceUsedReader | None:
        nvml = self.nvml or default_session()
        try:
            dev = torch_state.current_device(torch)
        except Exception:
            return None
        # kept for the session once CUDA is up, so a cell's start asks NVML nothing here
        index = read_device_map(nvml, torch=torch).nvml_index(dev)
        return DeviceUsedReader(nvml, index) if index is not None else None

    # -- parts ----------------------------------------------------------------------------
    def _throughput(self, plan: StepPlan, steps: StepStats, gpu: GpuPart | None, torch: Any) -> Any:
        if plan.steps_seen == 0:
            return None  # no training loop: nothing to say about FLOPs
        count = plan.flop_count
        measured, note = None, ""
        if gpu is not None and count is not None:
            measured, note = measured_peaks(torch_state.device_uuid(torch, gpu.device), self.environ)
        # the GPU's peaks apply when the counted FLOPs ran on it (not a model left on the CPU)
        on_gpu = gpu is not None and count is not None and (
            count.gpu_flops * 2 >= count.flops if count.flops
            else self.instruments is not None and "cuda" in self.instruments.param_device_types)
        return assess(count, plan.flops_why_not, steps.median_ms, gpu.name if on_gpu and gpu else None, measured,
                      note)

    def _steps(self, ins: Instruments, excluded: AbstractSet[int] = frozenset()) -> StepStats:
        n = len(ins.step_t)
        marks = [self.t0, *ins.step_t]
        host = [(b - a) * 1000.0 for a, b in itertools.pairwise(marks)]
        spans = ins.step_spans
        if spans:
            times = per_step_ms(spans, host)
            covered = sum(last - first + 1 for first, last, _ in spans)
            source = "CUDA events"
            if covered > len(spans):  # a host-bound loop: events every MIN_GAP_S (step_events.py)
                source += f" every ~{covered / len(spans):.0f} steps, split by the host clock"
        else:
            source = "host clock"
            times = host
        first = times[0] if times else None
        # the warm-up, and the steps a closer look slowed (step_plan.py)
        steady = sorted(t for i, t in enumerate(times) if i >= self.warmup_steps and i not in excluded)
        excluded_here = tuple(sorted(i for i in excluded if self.warmup_steps <= i < n))
        median = statistics.median(steady) if steady else None
        p90 = _percentile(steady, 0.9) if steady else None
        per_s = 1000.0 / statistics.fmean(steady) if steady and statistics.fmean(steady) > 0 else None
        samples_per_s = per_s * ins.batch_size if per_s and ins.batch_size else None
        return StepStats(n, min(self.warmup_steps, n), first, median, p90, per_s,
                         samples_per_s, ins.batch_size, source, tuple(times), excluded_here)

    def _shares(self, ins: Instruments, t_end: float) -> TimeShares:
        begin = ins.first_fetch_t if ins.first_fetch_t is not None else self.t0
        end = ins.step_t[-1] if ins.step_t else t_end
        loop = end - begin if end > begin else t_end - self.t0
        return TimeShares(loop, ins.fetch_s, ins.fetch_n, ins.sync_n, ins.sync_gpu_n, ins.sync_s, ins.sync_gpu_s,
                          dict(ins.sync_by_method), ins.write_s, ins.write_n, ins.write_chars,
                          ins.loader_workers, ins.loader_pin_memory,
                          loop_start_s=(begin - self.t0) if end > begin else 0.0)

    def _why_no_gpu(self, torch: Any) -> str:
        if torch is None:
            return "torch is not imported in this kernel, so no GPU work was measured"
        if not getattr(torch.version, "cuda", None):
            return f"torch {torch.__version__} is a CPU-only build"
        return "this cell did not use CUDA (no CUDA context in this process)"

    def _gpu_part(self, torch: Any, end: NvmlEnd, nvml: NvmlSession) -> tuple[GpuPart | None, str]:
        try:
            dev = torch_state.current_device(torch)
            stats = torch_state.read_allocator(torch, dev)
            props = torch.cuda.get_device_properties(dev)
        except Exception as exc:
            return None, f"torch could not read CUDA memory statistics ({type(exc).__name__}: {exc})"
        before = self.before_alloc
        peak_alloc: int | None = stats.peak_allocated_bytes
        peak_res: int | None = stats.peak_reserved_bytes
        reset = self.reset_peak and before is not None
        if not self.reset_peak and before is not None:
            # the counter still holds an older peak: it is the cell's only if the cell raised it
            if stats.peak_allocated_bytes <= before.peak_allocated_bytes:
                peak_alloc = None
            if stats.peak_reserved_bytes <= before.peak_reserved_bytes:
                peak_res = None
        # NVML's view is of the device this kernel uses now (read at the end, read_nvml_end)
        nvml_index = end.index if end.device == dev else None
        own = end.own if nvml_index is not None else None
        window = end.util if nvml_index is not None and isinstance(end.util, UtilWindow) else None
        cc = (props.major, props.minor) if hasattr(props, "major") else None
        total = int(getattr(props, "total_memory", 0) or 0)
        if not total and nvml_index is not None:
            mem = nvml.device_query(nvml_index, "nvmlDeviceGetMemoryInfo")
            total = int(mem.total) if is_available(mem) else 0
        return GpuPart(
            device=dev,
            nvml_index=nvml_index,
            name=str(getattr(props, "name", f"cuda:{dev}")),
            total_bytes=total or None,
            peak_allocated_bytes=peak_alloc,
            peak_reserved_bytes=peak_res,
            end_allocated_bytes=stats.allocated_bytes,
            end_reserved_bytes=stats.reserved_bytes,
            nvml_process_bytes=own.self_bytes if own is not None else None,
            nvml_device_peak_bytes=self.instruments.device_used_peak if self.instruments else None,
            other_processes_bytes=own.others_bytes if own is not None else None,
            alloc_retries=stats.alloc_retries - (before.alloc_retries if before else 0),
            ooms=stats.ooms - (before.ooms if before else 0),
            util_mean_pct=window.mean_pct if window is not None else None,
            util_idle_share=window.idle_share if window is not None else None,
            util_samples=len(window.samples_pct) if window is not None else 0,
            compute_capability=cc,
            peak_reset=reset or before is None,
            child_processes_bytes=own.children_bytes if own is not None else None,
            process_match=own.how if own is not None else "",
        ), ""


def _describe(error: BaseException) -> str:
    """``Type: message``; the message of an exception whose ``__str__`` itself raises (a user's
    exception class) is said to be unreadable, and the profile is built all the same."""
    name = getattr(type(error), "__name__", "an exception")
    try:
        message = str(error)
    except BaseException as exc:  # noqa: BLE001 (the user's __str__: anything, even CancelledError)
        return f"{name} (its message could not be read: {type(exc).__name__} in {name}.__str__)"
    return f"{name}: {message}" if message else name
