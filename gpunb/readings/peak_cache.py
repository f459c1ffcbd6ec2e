"""Matmul throughput that ``%gpucheck`` measured on each GPU, kept for ``%%gpuprofile``'s MFU, and
its pinned host<->GPU copy bandwidth, kept for the monitor's PCIe limit lines.

The check's CUDA probe (a subprocess) times 8192² matmuls in bf16, TF32 and strict fp32. Its
figures are what this GPU really reaches (the H200 here: bf16 790 TFLOP/s, 80 % of the
datasheet's 989), so a profiled cell can say how close it came to them as well as to the
datasheet. They are kept in this process and in a small JSON file, keyed by the GPU's UUID,
so a check run earlier (in another kernel, or ``gpunb check`` in a terminal) still counts;
each entry says when, and by which process, it was measured.

File: ``$GPUNB_CACHE_DIR/matmul_peaks.json``, else ``$XDG_CACHE_HOME/gpunb/...``, else
``~/.cache/gpunb/...``. A file that cannot be read or written is no error: the figures of
this process are still used, and a profile without them names only the datasheet peak.

The file may sit in a directory another user controls (a shared ``GPUNB_CACHE_DIR``), so it goes
through the one guarded place (``untrusted_file.GuardedFolder``): it is believed only when it is
this user's and nobody else can write it or its folder (a folder others can write needs the
sticky bit), read without following links or blocking on a FIFO, at most 256 KiB, every entry
type- and range-checked (a figure another user planted, 1e30 TFLOP/s or a 400-digit integer,
is ignored, never raised as ``OverflowError``). A bad file or entry is ignored and
:func:`lookup_noted` says why in one sentence; no reader raises into a cell or a monitor
thread. Writes go through a 0600 file in a private folder, renamed into place, removed when the
write fails (a full disk leaves nothing behind).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunb.readings.untrusted_file import GuardedFolder, NotWritten, Untrusted, in_range

FILE_NAME = "matmul_peaks.json"
MAX_BYTES = 256 * 1024  # one entry per GPU is ~200 bytes
PRECISIONS = ("bf16", "tf32", "fp32")  # what the probe measures (cuda_probe_script.matmul)
# Copies of pinned host memory the probe times (cuda_probe_script.copy_bandwidth): the result's key
# -> the direction kept here. The monitor draws them as its PCIe charts' limit lines.
COPY_KEYS = {"pinned_gbps": "h2d", "pinned_d2h_gbps": "d2h"}
# What a figure may be. The H200's dense bf16 datasheet peak is 989 TFLOP/s (measured 790 here);
# 20,000 leaves room for GPUs to come and refuses a planted 1e30. Pinned copies: PCIe 6 x16 is
# 128 GB/s, NVLink-C2C 900 GB/s; 10,000 GB/s is past both.
MAX_TFLOPS = 20_000.0
MAX_COPY_GBPS = 10_000.0
MAX_TEXT = 256  # a GPU's name, a time, a torch version
MAX_PID = 2**31 - 1

_this_process: dict[str, MeasuredPeaks] = {}  # uuid -> peaks measured by this process's checks


@dataclass(frozen=True)
class MeasuredPeaks:
    uuid: str  # "GPU-..." (or "MIG-...") as NVML and the probe spell it
    name: str
    tflops: dict[str, float]  # precision ("bf16", "tf32", "fp32") -> TFLOP/s measured
    measured_at: str  # local time, "YYYY-MM-DD HH:MM"
    pid: int  # the process whose check measured it
    torch_version: str = ""
    copy_gbps: dict[str, float] = field(default_factory=dict)  # "h2d"/"d2h" -> GB/s of pinned copies

    @property
    def h2d_gbps(self) -> float | None:
        """The pinned host->device copy %gpucheck measured (%%gpuprofile's PCIe figure)."""
        return self.copy_gbps.get("h2d")

    @property
    def this_process(self) -> bool:
        return self.pid == os.getpid()

    def source(self) -> str:
        """Where the figure comes from, in words for a report."""
        if self.this_process:
            return f"%gpucheck in this kernel, {self.measured_at}"
        return f"%gpucheck on {self.measured_at} (cached)"


def _norm(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def cache_file(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("GPUNB_CACHE_DIR"):
        return Path(env["GPUNB_CACHE_DIR"]) / FILE_NAME
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "gpunb" / FILE_NAME


def _read_file(path: Path) -> dict[str, Any]:
    """The cache's entries; raises :class:`Untrusted` when the file is not a cache file this user
    wrote in a folder only this user can change."""
    if not os.path.lexists(path):
        return {}
    try:
        folder = GuardedFolder.open(path.parent)
    except NotWritten as exc:
        raise Untrusted(str(exc)) from None
    with folder:
        data: dict[str, Any] = folder.read_json(path.name, max_bytes=MAX_BYTES, owned=True)
    return data


def _figure(value: object, high: float) -> bool:
    return in_range(value, 0.0, high) and value != 0


def _entry(uuid: str, raw: object) -> MeasuredPeaks | None:
    """One entry, or None when it does not have the shape :func:`remember` writes."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tflops", {}), dict) \
            or not isinstance(raw.get("copy_gbps", {}), dict):
        return None
    tflops = {p: float(v) for p, v in raw.get("tflops", {}).items() if p in PRECISIONS and _figure(v, MAX_TFLOPS)}
    copy = {d: float(v) for d, v in raw.get("copy_gbps", {}).items()
            if d in COPY_KEYS.values() and _figure(v, MAX_COPY_GBPS)}
    pid = raw.get("pid", -1)
    text = {k: raw.get(k, "") for k in ("name", "measured_at", "torch_version")}
    if not (tflops or copy) or not (isinstance(pid, int) and in_range(pid, -MAX_PID, MAX_PID)) \
            or not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in text.values()):
        return None
    return MeasuredPeaks(uuid, text["name"], tflops, text["measured_at"], pid, text["torch_version"], copy)


def remember(uuid: str, name: str, result: Mapping[str, object], *, torch_version: str = "",
             environ: Mapping[str, str] | None = None,
             copy: Mapping[str, object] | None = None) -> MeasuredPeaks | None:
    """Keep one GPU's probe results (matmul ``{"bf16_tflops": ..., ...}``, and the copy step's
    ``{"pinned_gbps": ..., "pinned_d2h_gbps": ...}``) in this process and in the cache file (written
    atomically; a failure to write is ignored)."""
    tflops: dict[str, float] = {}
    for p in PRECISIONS:
        value = result.get(f"{p}_tflops")
        if _figure(value, MAX_TFLOPS):
            tflops[p] = float(value)  # type: ignore[arg-type]
    copy_gbps = {direction: float(v) for key, direction in COPY_KEYS.items()  # type: ignore[arg-type]
                 if _figure(v := (copy or {}).get(key), MAX_COPY_GBPS)}
    if not uuid or not (tflops or copy_gbps):
        return None
    peaks = MeasuredPeaks(uuid, name, tflops, time.strftime("%Y-%m-%d %H:%M"), os.getpid(), torch_version,
                          copy_gbps)
    _this_process[_norm(uuid)] = peaks
    path = cache_file(environ)
    try:
        with GuardedFolder.open(path.parent, create=True) as folder:
            if folder.problem:  # a file there would not be believed: do not leave one
                return peaks
            try:
                data = _read_file(path)
            except Untrusted:  # replaced below by this process's good entry
                data = {}
            data[uuid] = {"name": name, "tflops": tflops, "measured_at": peaks.measured_at, "pid": peaks.pid,
                          "torch_version": torch_version, "copy_gbps": copy_gbps}
            folder.replace(path.name, json.dumps(data, indent=1, sort_keys=True).encode())
    except (NotWritten, OSError):
        pass
    return peaks


def lookup(uuid: str | None, environ: Mapping[str, str] | None = None) -> MeasuredPeaks | None:
    """The latest measured peaks of this GPU: this process's own check first, then the file."""
    return lookup_noted(uuid, environ)[0]


def lookup_noted(uuid: str | None, environ: Mapping[str, str] | None = None) -> tuple[MeasuredPeaks | None, str]:
    """:func:`lookup` and, when the cache had something for this GPU that was ignored, why (one
    sentence for the report; '' otherwise)."""
    if not uuid:
        return None, ""
    own = _this_process.get(_norm(uuid))
    if own is not None:
        return own, ""
    try:
        return _from_file(uuid, environ)
    except Exception as exc:  # noqa: BLE001 (a figure costs the MFU line, never a cell or the monitor)
        return None, f"the measured-peak cache was ignored ({type(exc).__name__}: {exc})"


def _from_file(uuid: str, environ: Mapping[str, str] | None) -> tuple[MeasuredPeaks | None, str]:
    path = cache_file(environ)
    fix = f"run %gpucheck to measure again, or delete {path}"
    try:
        data = _read_file(path)
    except Untrusted as exc:
        return None, f"the measured-peak cache was ignored: {exc}; {fix}"
    for key, raw in data.items():
        if isinstance(key, str) and _norm(key) == _norm(uuid):
            entry = _entry(key, raw)
            if entry is None:
                return None, f"the measured-peak cache's entry for this GPU was ignored (not gpunb's format); {fix}"
            return entry, ""
    return None, ""


def forget_this_process() -> None:
    """Drop what this process remembered (tests)."""
    _this_process.clear()
