"""The kernel's side of profiling worker processes: open a channel while a profiled cell runs,
collect what the workers wrote when it ends.

Opening it makes a temporary directory and puts two things in the kernel's environment, which
every process the cell starts inherits: ``GPUNB_RANK_CHANNEL`` (the directory) and, first on
``PYTHONPATH``, the directory holding gpunb's ``sitecustomize`` (``boot/``), which makes a
fresh interpreter (torchrun's ranks, ``multiprocessing`` spawn) record its steps once it imports
torch. Forked children need neither: ``rank_recorder``'s fork handler sees the open channel.
Closing restores the environment (leaving alone what the cell itself changed), reads every
``rank-<pid>.json`` and removes the directory; a worker still running then writes nowhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gpunb.analysis.ranks import recorder as rank_recorder
from gpunb.analysis.ranks.recorder import ENV_CHANNEL

BOOT_DIR = str(Path(__file__).with_name("boot"))


class RankChannel:
    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.path: str | None = None
        self._saved: dict[str, str | None] = {}
        self._set: dict[str, str] = {}

    def open(self, kernel_instruments: Any = None) -> RankChannel:
        """Start listening; ``kernel_instruments`` are the cell's own hooks, which a forked
        child takes out before it records its own steps."""
        self.path = tempfile.mkdtemp(prefix="gpunb-ranks-")
        old_path = self.environ.get("PYTHONPATH")
        self._saved = {ENV_CHANNEL: self.environ.get(ENV_CHANNEL), "PYTHONPATH": old_path}
        self._set = {ENV_CHANNEL: self.path,
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
            elif key == "PYTHONPATH" and now and now.split(os.pathsep)[0] == BOOT_DIR:
                rest = now.split(os.pathsep)[1:]  # the cell added to it: keep that, drop ours
                if rest:
                    self.environ[key] = os.pathsep.join(rest)
                else:
                    self.environ.pop(key, None)
        self._set = {}
        records = read_records(self.path) if self.path else []
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
        return records


def read_records(path: str) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(path)):
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(path, name)) as f:
                record = json.load(f)
        except (OSError, ValueError):  # half-written by a killed worker: its last complete write is gone
            continue
        if isinstance(record, dict) and record.get("steps"):
            out.append(record)
    return sorted(out, key=lambda r: (r.get("started_unix") or 0, r.get("pid") or 0))
