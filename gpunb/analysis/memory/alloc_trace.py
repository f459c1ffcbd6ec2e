"""``%%gpumem --trace`` / ``gpunb.trace_memory()``: one cell's allocations, recorded and explained.

``start()`` names the tensors alive now (census), resets torch's peak counter (as
``%%gpuprofile`` does; documented), notes what is allocated and switches torch's allocation
history on; ``stop()`` takes the snapshot, puts the history back as it was, names the
tensors again and replays the events (:mod:`alloc_timeline`). Nothing here raises into the
user's cell: a failure becomes the record's ``unavailable`` or a note.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpunb.analysis.memory.alloc_records import MemoryTrace, OomSites
from gpunb.readings.alloc_history import CELL_MAX_ENTRIES, HistoryRecording, save_snapshot, unavailable


def roles_by_address(census: Any) -> dict[int, str]:
    """Census role of each CUDA storage, by its address (what allocator blocks are keyed by)."""
    if census is None:
        return {}
    return {e.address: e.role for e in census.entries if e.address and e.device.startswith("cuda")}


def _describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {str(err)[:160]}"
    except BaseException:  # noqa: BLE001 (an exception's __str__ may raise)
        return type(err).__name__


class TraceSession:
    def __init__(self, *, torch: Any, namespace: Mapping[str, Any] | None = None,
                 cell_numbers: Callable[[], Mapping[str, int]] = dict, label: str = "",
                 save_path: str | None = None, max_entries: int = CELL_MAX_ENTRIES) -> None:
        self.torch = torch
        self.namespace = namespace
        self.cell_numbers = cell_numbers
        self.label = label
        self.save_path = save_path
        self.max_entries = max_entries
        self.reason = ""
        self.device = 0
        self.baseline_bytes = 0
        self.start_roles: dict[int, str] = {}
        self.recording: HistoryRecording | None = None
        self.notes: list[str] = []

    def _census_roles(self) -> dict[int, str]:
        from gpunb.analysis.memory.census import take_census

        try:
            return roles_by_address(take_census(dict(self.namespace or {}), torch=self.torch, devices={"cuda"}))
        except Exception as err:  # noqa: BLE001 (a hostile namespace object: roles fall back to the stacks)
            self.notes.append(f"the notebook's tensors could not be named ({_describe(err)})")
            return {}

    def start(self) -> None:
        """Switch the history on; whatever ends it (a Ctrl-C too), nothing is left on when it raises."""
        try:
            self._start()
        except BaseException:
            self.abort()
            raise

    def _start(self) -> None:
        self.reason = unavailable(self.torch)
        if self.reason:  # no GPU, no driver, a CPU torch: said as the machine's statement
            self.reason = _machine_without_cuda() or self.reason
        if self.reason:
            return
        torch = self.torch
        try:
            self.device = torch.cuda.current_device()
            self.start_roles = self._census_roles()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = int(torch.cuda.memory_allocated(self.device))
            # kept before it starts: stop() and abort() switch off what a cut-off start switched on
            self.recording = HistoryRecording(torch, max_entries=self.max_entries)
            self.recording.start()
        except Exception as err:  # noqa: BLE001 (the cell runs untraced, said in one line)
            self.abort()
            self.reason = f"torch's allocation history could not be started ({_describe(err)})"

    def abort(self) -> None:
        """Put the history back as it was, without a record (idempotent)."""
        if self.recording is not None:
            self.recording.stop()  # before it is forgotten: a Ctrl-C between the two leaves it known
        self.recording = None

    def stop(self, exc: BaseException | None = None) -> MemoryTrace:
        """Take the snapshot and put the history back; it is back when this returns or raises."""
        try:
            return self._stop(exc)
        finally:
            self.abort()

    def _stop(self, exc: BaseException | None) -> MemoryTrace:
        trace = MemoryTrace(label=self.label, unavailable=self.reason, notes=self.notes,
                            error=type(exc).__name__ if exc is not None else "")
        recording = self.recording
        if recording is None:
            return trace
        try:
            snapshot = recording.snapshot()
            trace.torch_peak_bytes = int(self.torch.cuda.max_memory_allocated(self.device))
        except Exception as err:  # noqa: BLE001
            trace.unavailable = f"torch's allocation history could not be read ({_describe(err)})"
            return trace
        finally:
            self.abort()  # the history is off again (or as the user had it) whatever happened
        try:
            self._explain(trace, snapshot, recording)
        except Exception as err:  # noqa: BLE001 (a snapshot of a shape we do not know)
            trace.notes.append(f"the history could not be replayed ({_describe(err)})")
        if self.save_path:
            try:
                trace.saved_bytes = save_snapshot(snapshot, self.save_path)
                trace.saved_path = self.save_path
            except ValueError as err:
                trace.notes.append(f"the snapshot was not saved: {err}")
        return trace

    def _explain(self, trace: MemoryTrace, snapshot: dict[str, Any], recording: HistoryRecording) -> None:
        from gpunb.analysis.memory.alloc_timeline import replay

        traces = snapshot.get("device_traces") or []
        recorded = len(traces[self.device]) if self.device < len(traces) else 0
        if recording.ours and recorded >= recording.max_entries:
            trace.notes.append(f"the history kept only the last {recording.max_entries} events: the cell's start is "
                               "missing; a larger --max-entries keeps it")
        if not recording.ours:
            trace.notes.append("torch's allocation history was already on (your own recording): gpunb read it and "
                               "left it on")
        result = replay(snapshot, device=self.device, baseline_bytes=self.baseline_bytes,
                        start_roles=self.start_roles, end_roles=self._census_roles(),
                        cell_numbers=self.cell_numbers(), start_us=recording.start_us)
        trace.device = self.device
        trace.events = result.events
        trace.baseline_bytes = self.baseline_bytes
        trace.end_bytes = result.end_bytes
        trace.peak_bytes = result.peak_bytes
        trace.peak_t = result.peak_t
        trace.peak_by_role = result.peak_by_role
        trace.sites_at_peak = result.sites_at_peak
        trace.points = result.points
        trace.time_unit = result.time_unit
        trace.notes += list(result.notes)
        failed = oom_sites(snapshot, device=self.device, cell_numbers=self.cell_numbers())
        trace.oom_at, trace.oom_bytes = failed.failed_at, failed.requested_bytes
        if trace.torch_peak_bytes is not None and result.events and trace.torch_peak_bytes != result.peak_bytes:
            trace.notes.append(f"torch's max_memory_allocated over the cell is {trace.torch_peak_bytes} bytes, the "
                               f"replayed peak {result.peak_bytes}: another thread or stream allocated outside "
                               "the recorded history")


def oom_sites(snapshot: Mapping[str, Any], *, device: int, cell_numbers: Mapping[str, int],
              top: int = 5) -> OomSites:
    """From the armed history's snapshot, taken while the failed cell still pins its tensors: the
    line whose request failed (the last ``oom`` event's stack) and the lines that allocated the
    largest blocks alive."""
    from gpunb.analysis.memory.alloc_sites import site_of
    from gpunb.analysis.memory.alloc_timeline import cell_events, live_blocks, sites_of_blocks

    ooms = [e for e in cell_events(snapshot, device) if e.get("action") == "oom"]
    failed_at, requested = "", None
    stack: tuple[str, ...] = ()
    if ooms:
        failed_at, stack = site_of(ooms[-1].get("frames"), cell_numbers)
        size = ooms[-1].get("size")
        requested = size if isinstance(size, int) else None
    return OomSites(failed_at, stack, requested, sites_of_blocks(live_blocks(snapshot, device), cell_numbers, top))


def _machine_without_cuda() -> str:
    """The machine's statement when it has no GPU torch could trace (no GPU, no driver, a CPU
    build of torch), as every magic says it; "" when the GPUs are there."""
    from gpunb.analysis.machine import machine_of
    from gpunb.readings.nvml import default_session

    machine = machine_of(default_session())
    return "" if machine.state in ("gpus", "nvml_slow") else f"{machine.text()} The cell runs untraced."
