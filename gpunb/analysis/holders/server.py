"""Inside a notebook kernel: who holds each GPU, in words, for the monitor and the OOM doctor.

With a reachable Jupyter server running gpunb's extension the answer names notebooks
(``lesson3.ipynb (idle 40 min) holds 31.0 GiB``); without one (VS Code, terminal IPython,
an older server) it falls back to what NVML alone says: PIDs and process names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gpunb.analysis.holders.gpus import GpuHolder, describe
from gpunb.analysis.holders.kernel_energy import idle_energy_line
from gpunb.readings.server_sessions import ServerReading, default_sessions
from gpunb.readings.test_hooks import fake_note
from gpunb.units import gib

MAX_LINES = 6  # per GPU; the rest is summed in one more line


def server_holders(reading: ServerReading) -> list[GpuHolder]:
    """Every GPU process the server reported (none when ``reading`` is empty)."""
    if reading.data is None:  # (what ``not reading`` means)
        return []
    out = []
    for gpu in reading.data.get("gpus", ()):
        for row in gpu.get("processes", ()) if isinstance(gpu, dict) else ():
            try:
                out.append(GpuHolder.from_dict(row))
            except TypeError:  # a server of another gpunb version: skip what does not fit
                continue
    return out


def _now(reading: ServerReading) -> float:
    t = reading.data.get("t_unix") if reading.data is not None else None
    return t if isinstance(t, (int, float)) else time.time()


def _lines(items: list[tuple[int | None, str]]) -> list[str]:
    """``(bytes, who)`` pairs as lines, largest first, at most MAX_LINES."""
    items = sorted(items, key=lambda x: -(x[0] or 0))
    lines = [f"{who} holds {gib(b) if b is not None else 'an unknown amount'}" for b, who in items[:MAX_LINES]]
    rest = items[MAX_LINES:]
    if rest:
        lines.append(f"{len(rest)} more process(es) hold {gib(sum(b or 0 for b, _ in rest))}")
    return lines


def holder_lines(reading: ServerReading, gpu_index: int) -> list[str]:
    """The server's view of GPU ``gpu_index`` (NVML's index: the same for every process of
    the machine), one line per holder."""
    now = _now(reading)
    items = []
    for h in server_holders(reading):
        if h.gpu_index != gpu_index:
            continue
        idle = idle_energy_line(h, now) if h.kernel_id != reading.kernel_id else ""
        items.append((h.used_bytes, f"{idle}; it" if idle else describe(h, now, reading.kernel_id)))
    fake = reading.data.get("fake_sources") if reading.data and reading.data.get("fake") is True else None
    marked = [fake_note(tuple(str(x) for x in fake) if isinstance(fake, list) else ("the server's",))] \
        if fake is not None else []
    lines = _lines(items)
    return marked + lines if lines else []  # a server on gpunb's test stand-ins says so first


def pid_lines(processes: Iterable[Any], own_pids: Iterable[int]) -> list[str]:
    """Without a server: NVML's processes (``GpuProcess``) by PID and name."""
    own = set(own_pids)
    items = []
    for p in processes:
        used = p.used_bytes if isinstance(p.used_bytes, int) else None
        items.append((used, "this kernel" if p.pid in own else f"PID {p.pid} {p.name}".rstrip()))
    return _lines(items)


def names_by_pid(reading: ServerReading) -> dict[int, str]:
    """PID -> who it is (``lesson3.ipynb (idle 40 min)``) for every process the server mapped."""
    now = _now(reading)
    return {h.pid: describe(h, now, reading.kernel_id) for h in server_holders(reading)}


def ask_server(wait: bool) -> ServerReading:
    """This kernel's server's answer: at once from the cache (``wait=False``: redraw loops),
    or waiting up to the request timeout (one-off reports)."""
    sessions = default_sessions()
    return sessions.get() if wait else sessions.latest()

