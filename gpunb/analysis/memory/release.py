"""Give back the memory a failed cell pins, and measure how much came back.

An exception keeps every frame of its traceback alive, and with them every local tensor.
In IPython the holders are ``sys.last_type/last_value/last_traceback/last_exc``,
``shell.InteractiveTB.tb`` (kept for ``%debug``), the exception stored in
``shell.last_execution_result``, and the output history (``Out``, ``_``, ``_N``) for
values a cell returned. Clearing frames (:func:`traceback.clear_frames`) drops the locals
while the exception object, and the printed traceback, stay. Verified on IPython 9.18:
with these cleared, ``gc.collect()`` frees the objects (see research/ecosystem.md §6).
"""

from __future__ import annotations

import gc
import inspect
import os
import sys
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from gpunb import units
from gpunb.analysis.memory.oom_message import exception_chain

# Config switch: keep the failed cell's frames for %debug (``%gpumem --keep-traceback on``).
KEEP_TRACEBACK_ENV = "GPUNB_KEEP_TRACEBACK"


def keep_traceback_default() -> bool:
    return os.environ.get(KEEP_TRACEBACK_ENV, "").strip().lower() in ("1", "on", "true", "yes")


@dataclass(frozen=True)
class MemoryPoint:
    """Memory of this process at one moment (bytes; None where unknown)."""

    torch_allocated_bytes: int | None
    torch_reserved_bytes: int | None
    nvml_process_bytes: int | None  # this process on the GPU, all libraries

    def to_dict(self) -> dict[str, Any]:
        return {
            "torch_allocated_bytes": self.torch_allocated_bytes,
            "torch_reserved_bytes": self.torch_reserved_bytes,
            "nvml_process_bytes": self.nvml_process_bytes,
        }


@dataclass(frozen=True)
class ReleaseReport:
    before: MemoryPoint
    after: MemoryPoint
    cleared: tuple[str, ...]  # what was let go, in words
    kept_traceback: bool = False
    pinned_bytes: int | None = None  # what the failed cell's frames held (census), if measured
    output_entries: tuple[str, ...] = field(default_factory=tuple)

    @staticmethod
    def _delta(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a - b

    @property
    def freed_allocated_bytes(self) -> int | None:
        return self._delta(self.before.torch_allocated_bytes, self.after.torch_allocated_bytes)

    @property
    def freed_reserved_bytes(self) -> int | None:
        return self._delta(self.before.torch_reserved_bytes, self.after.torch_reserved_bytes)

    @property
    def freed_process_bytes(self) -> int | None:
        return self._delta(self.before.nvml_process_bytes, self.after.nvml_process_bytes)

    @property
    def returned_fraction(self) -> float | None:
        """Freed tensor bytes / bytes the failed cell's frames pinned."""
        freed = self.freed_allocated_bytes
        if freed is None or not self.pinned_bytes:
            return None
        return max(0.0, freed / self.pinned_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "cleared": list(self.cleared),
            "kept_traceback": self.kept_traceback,
            "pinned_bytes": self.pinned_bytes,
            "freed_allocated_bytes": self.freed_allocated_bytes,
            "freed_reserved_bytes": self.freed_reserved_bytes,
            "freed_process_bytes": self.freed_process_bytes,
            "returned_fraction": self.returned_fraction,
            "output_entries": list(self.output_entries),
        }


def measure(torch: Any, device: int | None, nvml_process_bytes: Callable[[], int | None] | None = None) -> MemoryPoint:
    alloc = reserved = None
    if torch is not None and device is not None:
        try:
            if torch.cuda.is_initialized():
                alloc = int(torch.cuda.memory_allocated(device))
                reserved = int(torch.cuda.memory_reserved(device))
        except Exception:
            pass
    proc = None
    if nvml_process_bytes is not None:
        try:
            proc = nvml_process_bytes()
        except Exception:
            proc = None
    return MemoryPoint(alloc, reserved, proc)


def clear_exception_frames(exc: BaseException | None) -> int:
    """Drop the locals of every finished frame ``exc`` (and its chain) holds. Returns frames cleared."""
    n = 0
    for e in exception_chain(exc) if exc is not None else ():
        tb = e.__traceback__
        while tb is not None:
            if clear_frame(tb.tb_frame):
                n += 1
            tb = tb.tb_next
    return n


def clear_frame(frame: Any) -> bool:
    """``frame.clear()``, plus the locals snapshot Python 3.11/3.12 cache on function frames.

    Reading ``frame.f_locals`` of a function frame (tracebacks formatters and debuggers do)
    stores a dict on the frame that ``frame.clear()`` leaves alone: measured here, an object
    referenced only from that snapshot stays alive. Module-level frames are skipped for that
    step: their locals *are* the notebook namespace.
    """
    optimized = bool(frame.f_code.co_flags & inspect.CO_OPTIMIZED)
    snapshot = None
    if optimized:
        try:
            snapshot = frame.f_locals
        except Exception:
            snapshot = None
    try:
        frame.clear()
    except RuntimeError:  # still running (not ours to clear)
        return False
    if type(snapshot) is dict:  # 3.13+ gives a write-through proxy: nothing cached to clear
        snapshot.clear()
    return True


def holds_tensor(value: Any, torch: Any, devices: AbstractSet[str] | None, depth: int = 2) -> bool:
    """Does an output-history value hold a tensor (on ``devices``), looking ``depth`` deep?
    A value that raises when looked at (an unbound proxy, say) counts as holding none."""
    if torch is None:
        return False
    try:
        return _holds_tensor(value, torch, devices, depth)
    except BaseException:  # noqa: BLE001 (a user object may raise anything: CancelledError too)
        return False


def _holds_tensor(value: Any, torch: Any, devices: AbstractSet[str] | None, depth: int) -> bool:
    if isinstance(value, torch.Tensor):
        return devices is None or value.device.type in devices
    if depth <= 0:
        return False
    if isinstance(value, dict):
        return any(_holds_tensor(v, torch, devices, depth - 1) for v in list(value.values())[:1000])
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, torch, devices, depth - 1) for v in value[:1000])
    return False


def drop_output_history(shell: Any, torch: Any, devices: AbstractSet[str] | None) -> list[str]:
    """Remove output-history entries that hold tensors; returns their names (``Out[3]``)."""
    if shell is None:
        return []
    ns = shell.user_ns
    out = ns.get("Out")
    dropped: list[str] = []
    if isinstance(out, dict):
        for n, value in list(out.items()):
            if holds_tensor(value, torch, devices):
                del out[n]
                dropped.append(f"Out[{n}]")
                if f"_{n}" in ns and ns[f"_{n}"] is value:
                    del ns[f"_{n}"]
    for name in ("_", "__", "___"):
        if holds_tensor(ns.get(name), torch, devices):
            ns[name] = ""
            dh = getattr(shell, "displayhook", None)
            if dh is not None and hasattr(dh, name):
                setattr(dh, name, "")
            dropped.append(name)
    return dropped


def release_failure(
    shell: Any,
    exc: BaseException | None,
    *,
    torch: Any = None,
    device: int | None = None,
    keep_traceback: bool = False,
    drop_outputs: bool = True,
    devices: AbstractSet[str] | None = frozenset({"cuda"}),
    nvml_process_bytes: Callable[[], int | None] | None = None,
    pinned_bytes: int | None = None,
    held_bytes: dict[str, int] | None = None,
) -> ReleaseReport:
    """Free what a failed cell pins, then ``gc.collect()`` and ``empty_cache()``.

    With ``keep_traceback`` the frames and ``sys.last_*`` stay (``%debug`` works), and only
    the allocator's cache is returned. The exception object itself is never removed: the
    kernel still reports the cell as failed, with its traceback. ``held_bytes`` (from the
    tensor census: ``"frames"``, ``"previous error"``, ``"Out[3]"``...) puts amounts on what
    was let go.
    """
    held = held_bytes or {}

    def amount(key: str) -> str:
        if key not in held:
            return ""
        return f" ({units.gib(held[key], digits=2)} of tensors)" if held.get(key) else " (no tensors)"

    torch = torch if torch is not None else sys.modules.get("torch")
    before = measure(torch, device, nvml_process_bytes)
    cleared: list[str] = []
    dropped: list[str] = []
    if not keep_traceback:
        n = clear_exception_frames(exc)
        if n:
            cleared.append(f"locals of {n} traceback frames{amount('frames')}")
        last = getattr(sys, "last_value", None)
        if last is not None and last is not exc:
            n2 = clear_exception_frames(last)
            if n2:
                cleared.append(f"locals of {n2} frames of the previous error{amount('previous error')}")
        # Deleted, not set to None: IPython's %debug and %tb test for the attributes and
        # then say "No traceback ..." themselves; None made them raise AttributeError.
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                if getattr(sys, name) is not None:
                    cleared.append(f"sys.{name}")
                delattr(sys, name)
        itb = getattr(shell, "InteractiveTB", None) if shell is not None else None
        if itb is not None and getattr(itb, "tb", None) is not None:
            itb.tb = None
            cleared.append("IPython's stored traceback (%debug)")
    if drop_outputs and shell is not None:
        dropped = drop_output_history(shell, torch, devices)
        if dropped:
            cleared.append("output history: " + ", ".join(d + amount(d) for d in dropped))
    gc.collect()
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
                cleared.append("torch.cuda.empty_cache()")
        except Exception:
            pass
    after = measure(torch, device, nvml_process_bytes)
    return ReleaseReport(before, after, tuple(cleared), keep_traceback, pinned_bytes, tuple(dropped))
