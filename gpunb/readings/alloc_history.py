"""torch's allocator history: switch it on for a while, take its snapshot, put it back as it was.

The history is torch's own (``torch.cuda.memory._record_memory_history``): for every
allocation and free of the caching allocator it keeps the event and the Python stack that
made it, and ``torch.cuda.memory._snapshot()`` returns it with the blocks alive now, as
plain dicts of ints and strings (documented in ``torch/cuda/memory.py``, ``_snapshot``).
They are private functions, stable from torch 2.1 to 2.13; every key is read with a default,
so a missing one degrades a view, never a cell.

Cost (torch's docstring): about 2 µs per recorded event for the Python stack; the ring
buffer holds ``max_entries`` events of a few KB each. So it is off unless the user asks, and
bounded when on. The history holds frame strings, not tensors: it keeps no memory alive.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

from gpunb.readings.transaction import Transaction, open_transactions
from gpunb.readings.untrusted_file import GuardedFolder, NotWritten

# Events kept for one traced cell, and while the OOM doctor's history is armed: a training
# step of a small model is a few hundred events; 100 000 holds hundreds of steps and stays
# under ~100 MB of host memory.
CELL_MAX_ENTRIES = 100_000
ARMED_MAX_ENTRIES = 20_000
HISTORY_SWITCH = "torch allocation history"  # the name of its transactions
MIN_TORCH = (2, 1)  # the history with "alloc/free_requested/free_completed" events and stacks="python"


def unavailable(torch: Any | None) -> str:
    """Why the history cannot be recorded here ('' when it can), as one sentence with the fix.
    Never starts CUDA: that takes ``torch.cuda.is_available()``, which the caller asks only
    when the user asked for a trace."""
    if torch is None:
        return "torch is not imported: import torch (a CUDA build) before tracing memory"
    version = _version_tuple(getattr(torch, "__version__", ""))
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if version < MIN_TORCH or not hasattr(memory, "_record_memory_history") or not hasattr(memory, "_snapshot"):
        return (f"torch {getattr(torch, '__version__', '?')} has no allocation history (it came in torch 2.1): "
                "upgrade torch to trace memory")
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build, so there is no CUDA allocator to trace: "
                "install a CUDA build of torch")
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to torch: check `%gpucheck`; the cell runs untraced"
    except Exception as exc:  # noqa: BLE001 (a broken driver: say so, run the cell)
        return f"CUDA could not be initialised ({type(exc).__name__}): check `%gpucheck`; the cell runs untraced"
    return ""


def _version_tuple(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def history_enabled(torch: Any) -> bool:
    """Is torch recording its allocator history now (the user's own recording, or ours)?"""
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # noqa: BLE001
        return False


@dataclass
class HistoryRecording:
    """One recording: ``start()`` switches the history on unless it already is (then it is
    left alone: the user is recording with settings of their own); ``snapshot()`` reads it;
    ``stop()`` switches it off only if ``start()`` switched it on."""

    torch: Any
    max_entries: int = CELL_MAX_ENTRIES
    ours: bool = False  # we switched it on, so we switch it off
    recording: bool = False  # on now, by us
    start_us: int | None = None  # events before this were not ours (when the user's recording was on)

    def __post_init__(self) -> None:
        self._transaction = Transaction(HISTORY_SWITCH)

    def start(self) -> None:
        import time

        if history_enabled(self.torch):
            self.start_us = time.time_ns() // 1000  # torch stamps events with the wall clock (time_us)
            return
        # the switch-off is registered before the switch-on: a Ctrl-C between the two (or inside
        # torch's call) leaves an undo that stop(), `%gpumem --trace off` or %unload_ext runs
        self._transaction.switch(self._switch_on, self._switch_off)

    def _switch_on(self) -> None:
        import time

        self.ours = self.recording = True
        record = self.torch.cuda.memory._record_memory_history
        try:  # clear_history: events of an earlier recording are not this one's
            record(enabled="all", context="all", stacks="python", max_entries=self.max_entries, clear_history=True)
        except TypeError:  # torch before 2.4 has no clear_history: older events are told apart by their time
            self.start_us = time.time_ns() // 1000
            record(enabled="all", context="all", stacks="python", max_entries=self.max_entries)

    def _switch_off(self) -> None:
        self.recording = False
        self.torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict[str, Any]:
        snap = self.torch.cuda.memory._snapshot()
        return snap if isinstance(snap, dict) else {}

    def stop(self) -> None:
        """Switch the history off if :meth:`start` switched it on (idempotent)."""
        self._transaction.close()


def switch_off_ours(keep: HistoryRecording | None = None) -> None:
    """Switch off every history gpunb switched on and has not switched off, but ``keep``'s
    (``%gpumem --trace off``; after every cell, for a traced cell's: whatever a Ctrl-C cut
    off, it ends with the cell; the user's own recording is left alone)."""
    kept = keep._transaction if keep is not None else None
    for transaction in open_transactions():
        if transaction.name == HISTORY_SWITCH and transaction is not kept:
            transaction.close()


def arm(torch: Any, max_entries: int = ARMED_MAX_ENTRIES) -> HistoryRecording:
    """Switch the history on until :meth:`HistoryRecording.stop` (``%gpumem --trace on``)."""
    rec = HistoryRecording(torch, max_entries=max_entries)
    rec.start()
    return rec


def save_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str]) -> int:
    """Write ``snapshot`` as the pickle memory_viz opens (what ``_dump_snapshot`` writes); returns its
    size in bytes. The file must be new (``O_EXCL``: never an existing file, never through a link
    someone planted in a shared directory such as /tmp), readable by this user only (0600), made
    through the guarded folder (``untrusted_file.GuardedFolder``): a write that fails half-way (a
    full disk) leaves no partial file. Raises ``ValueError`` with a sentence naming the cause."""
    target = os.fspath(path)
    try:
        with GuardedFolder.open(os.path.dirname(target) or ".") as folder:
            return folder.write_new(os.path.basename(target), lambda f: pickle.dump(snapshot, f))
    except NotWritten as exc:
        raise ValueError(str(exc)) from None
