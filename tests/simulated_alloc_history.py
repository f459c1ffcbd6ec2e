"""torch's allocation history replayed from a real H200 recording, for CPU tests of the trace paths.

``tests/data/alloc_history/`` holds what ``scripts/record_alloc_history.py`` (on main) recorded on
one H200 (torch 2.11.0+cu130, IPython 9.18.1; README.md there): the snapshot of a 3-step MLP
training cell (``In [3]``), the snapshot of an OOM (``In [5]`` keeps 12 GiB, ``In [6]`` asks
10 GiB under a 20 GiB cap), the cells' sources and torch's counters around the training cell.
Here ``torch.cuda`` answers as that process did; everything else is the real (CPU) torch.
"""

from __future__ import annotations

import json
import linecache
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.simulated_cuda import SimulatedCuda, SimulatedTorch, nested

DATA = Path(__file__).resolve().parent / "data" / "alloc_history"
RECORDING = json.loads((DATA / "recording.json").read_text())


def load(name: str) -> dict[str, Any]:
    with open(DATA / name, "rb") as f:
        return pickle.load(f)


def train_snapshot() -> dict[str, Any]:
    return load("train_snapshot.pickle")


def oom_snapshot() -> dict[str, Any]:
    return load("oom_snapshot.pickle")


def cache_cell_sources() -> dict[str, int]:
    """Put the recorded cells' sources in linecache under the file names the frames carry (as IPython
    did in the recording process); returns the file name -> cell number map IPython kept."""
    numbers = {}
    for filename in RECORDING["cell_files_seen"]:
        number = int(filename.split("-")[2])
        cell = next(k for k, v in RECORDING["execution_counts"].items() if v == number)
        source = RECORDING["cells"][cell]
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        numbers[filename] = number
    return numbers


class HistoryCuda(SimulatedCuda):
    """``torch.cuda`` with the allocation history of the recording: switching it on and off is
    noted (``history_calls``); the snapshot is the recorded one; the counters around the cell are
    the recorded ones."""

    def __init__(self, snapshot: dict[str, Any], *, baseline: int, peak: int, enabled: bool = False) -> None:
        stats = {"allocated_bytes.all.current": baseline, "allocated_bytes.all.peak": peak,
                 "reserved_bytes.all.current": peak, "reserved_bytes.all.peak": peak}
        super().__init__(["GPU-00000000-0000-0000-0000-000000000000"], stats, 150_754_820_096)
        self.snapshot = snapshot
        self.enabled = enabled
        self.history_calls: list[dict[str, Any]] = []
        self.memory = SimpleNamespace(_record_memory_history=self._record, _snapshot=lambda device=None: snapshot)

    def _record(self, enabled: Any = "all", **kwargs: Any) -> None:
        self.history_calls.append({"enabled": enabled, **kwargs})
        self.enabled = enabled is not None


class HistoryTorch(SimulatedTorch):
    def __init__(self, cuda: HistoryCuda) -> None:
        super().__init__(cuda)
        self.__version__ = "2.11.0+cu130"
        self._C = SimpleNamespace(_cuda_memoryStats=lambda device: nested(cuda.stats),
                                  _cuda_isHistoryEnabled=lambda: cuda.enabled)


def recorded_torch(enabled: bool = False) -> HistoryTorch:
    """The training cell's process: allocated before the cell and torch's peak over it as recorded."""
    return HistoryTorch(HistoryCuda(train_snapshot(), baseline=RECORDING["base_allocated_before_train"],
                                    peak=RECORDING["max_memory_allocated_train"], enabled=enabled))
