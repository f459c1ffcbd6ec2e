"""The kernel's side of profiling worker processes: open a channel while a profiled cell runs,
collect what the workers wrote when it ends.

Opening it makes a private temporary directory (``channel_dir``: 0700, named by path and
identity) and puts three things in the kernel's environment, which every process the cell
starts inherits: ``GPUNB_RANK_CHANNEL`` (the directory), ``GPUNB_RANK_CHANNEL_ID`` (its
identity) and, first on ``PYTHONPATH``, the directory holding gpunb's ``sitecustomize``
(``boot/``), which makes a fresh interpreter (torchrun's ranks, ``multiprocessing`` spawn)
record its steps once it imports torch. Forked children need neither: ``rank_recorder``'s fork
handler sees the open channel. Closing restores the environment (leaving alone what the cell
itself changed, and taking gpunb's ``PYTHONPATH`` entry out wherever the cell moved it), reads
every ``rank-<pid>.json`` and removes the directory; a worker still running then writes nowhere.

The records are read as untrusted (``untrusted_file``; a worker may have been killed mid-write,
or be someone's stray process): this user's regular files only, non-blocking, size-capped,
schema-checked (``record_problem``); a bad one is left out with one note. Attribution: a forked
child runs the cell's own code and counts as a rank; a fresh interpreter counts only when it
also joined a ``torch.distributed`` process group (an unrelated training script the cell
starts with ``subprocess`` is not a rank of the cell).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gpunb.analysis.ranks import recorder as rank_recorder
from gpunb.analysis.ranks.channel_dir import ENV_CHANNEL, ENV_CHANNEL_ID, identity, open_dir
from gpunb.readings.untrusted_file import Untrusted, is_number, read_json

BOOT_DIR = str(Path(__file__).with_name("boot"))
MAX_RECORD_BYTES = 1 << 20  # a record keeps at most 4096 step times: ~100 KiB
MAX_RECORDS = 1024  # a cell with more worker processes than this is not read further


class RankChannel:
    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.path: str | None = None
        self.notes: list[str] = []  # records left out, and why
        self._id: str | None = None
        self._saved: dict[str, str | None] = {}
        self._set: dict[str, str] = {}

    def open(self, kernel_instruments: Any = None) -> RankChannel:
        """Start listening; ``kernel_instruments`` are the cell's own hooks, which a forked
        child takes out before it records its own steps."""
        self.path = tempfile.mkdtemp(prefix="gpunb-ranks-")  # 0700, this user's
        self._id = identity(os.stat(self.path))
        old_path = self.environ.get("PYTHONPATH")
        self._saved = {k: self.environ.get(k) for k in (ENV_CHANNEL, ENV_CHANNEL_ID, "PYTHONPATH")}
        self._set = {ENV_CHANNEL: self.path, ENV_CHANNEL_ID: self._id,
                     "PYTHONPATH": BOOT_DIR + (os.pathsep + old_path if old_path else "")}
        self.environ.update(self._set)
        rank_recorder.set_kernel_instruments(kernel_instruments)
        return self

    def close(self) -> list[dict[str, Any]]:
        """Stop listening and return the workers' records (oldest worker first)."""
        rank_recorder.set_kernel_instruments(None)
        for key, ours in self._set.items():
            now = self.environ.get(key)
            before = self._saved.get(key)
            if now == ours:
                if before is None:
                    self.environ.pop(key, None)
                else:
                    self.environ[key] = before
            elif key == "PYTHONPATH" and now:
                # the cell changed it (prepended its own entry, the usual idiom, or appended): keep
                # theirs, drop ours wherever it now is
                rest = [p for p in now.split(os.pathsep) if p != BOOT_DIR]
                if rest:
                    self.environ[key] = os.pathsep.join(rest)
                else:
                    self.environ.pop(key, None)
        self._set = {}
        self.notes = []
        records: list[dict[str, Any]] = []
        if self.path:
            records, self.notes = read_records(self.path, self._id)
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
        return records


def read_records(path: str, expected_id: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The usable worker records in the channel directory (oldest worker first), and a note
    for each group of records left out."""
    fd = open_dir(path, expected_id)
    if fd is None:
        return [], [f"the rank channel {path} was replaced or is no longer private: no worker record was read"]
    out, bad, not_ranks, names = [], [], [], []
    try:
        try:
            names = sorted(n for n in os.listdir(fd) if n.startswith("rank-") and n.endswith(".json"))
        except OSError as exc:
            return [], [f"the rank channel {path} could not be listed ({exc.strerror or exc})"]
        for name in names[:MAX_RECORDS]:
            try:
                record = read_json(name, dir_fd=fd, owned=True, max_bytes=MAX_RECORD_BYTES)
            except Untrusted as exc:  # half-written by a killed worker, a FIFO, someone else's
                bad.append(f"{name} ({str(exc).removeprefix(name + ' ')})")
                continue
            why = record_problem(record)
            if why:
                bad.append(f"{name} ({why})")
            elif record["steps"] and not _is_rank(record):
                not_ranks.append(record)
            elif record["steps"]:
                out.append(record)
    finally:
        os.close(fd)
    notes = []
    if bad:
        notes.append(f"{len(bad)} worker record(s) left out, unreadable or not gpunb's: {'; '.join(bad[:3])}")
    if not_ranks:
        pids = ", ".join(str(r["pid"]) for r in not_ranks[:5])
        notes.append(f"{len(not_ranks)} process(es) the cell started trained without joining a torch.distributed "
                     f"process group (PID {pids}): not counted as ranks of this cell")
    if len(names) > MAX_RECORDS:
        notes.append(f"only the first {MAX_RECORDS} of {len(names)} worker records were read")
    return sorted(out, key=lambda r: (r.get("started_unix") or 0, r["pid"])), notes


def _is_rank(record: dict[str, Any]) -> bool:
    """A forked child of the kernel runs the cell's own code; a fresh interpreter is a rank
    only when it joined a process group."""
    return record.get("launcher") == "fork" or isinstance(record.get("group"), dict)


_NUMBER_OR_NONE = ("first_step_ms", "data_wait_s", "first_batch_s", "last_step_s", "wall_s", "started_unix")
_INT_OR_NONE = ("rank", "local_rank", "world_size", "device", "batch_size", "peak_allocated_bytes",
                "peak_reserved_bytes", "nvml_peak_bytes", "step_ms_offset", "batches", "ppid")
_STR_OR_NONE = ("launcher", "source", "backend", "host")
_DDP_NUMBERS = ("forward_ms", "backward_compute_ms", "backward_comm_ms", "overlap_ms")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def record_problem(record: dict[str, Any]) -> str:
    """Why a worker record does not have the shape ``RankRecorder.record`` writes ('' when it
    does): every field the report reads, type-checked."""
    if not (_int(record.get("pid")) and record["pid"] > 0):
        return "no process id"
    if not (_int(record.get("steps")) and record["steps"] >= 0):
        return "no step count"
    steps = record.get("step_ms")
    if not isinstance(steps, list) or not all(is_number(x) for x in steps):
        return "step times are not numbers"
    for key in _NUMBER_OR_NONE:
        if record.get(key) is not None and not is_number(record[key]):
            return f"{key} is not a number"
    for key in _INT_OR_NONE:
        if record.get(key) is not None and not _int(record[key]):
            return f"{key} is not a whole number"
    for key in _STR_OR_NONE:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is not text"
    gpu = record.get("gpu", {})
    if not isinstance(gpu, dict) \
            or any(gpu.get(k) is not None and not _int(gpu[k]) for k in ("nvml_index", "total_bytes")) \
            or any(gpu.get(k) is not None and not isinstance(gpu[k], str) for k in ("name", "uuid")):
        return "its GPU is not described as gpunb does"
    ddp = record.get("ddp")
    if ddp is not None and (not isinstance(ddp, dict)
                            or any(ddp.get(k) is not None and not is_number(ddp[k]) for k in _DDP_NUMBERS)
                            or (ddp.get("iteration") is not None and not _int(ddp["iteration"]))
                            or not isinstance(ddp.get("iterations", []), list)
                            or not all(_int(i) for i in ddp.get("iterations", []))):
        return "its DDP timing is not gpunb's"
    if record.get("group") is not None and not isinstance(record["group"], dict):
        return "its process group is not gpunb's"
    return ""
