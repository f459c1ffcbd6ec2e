"""Run the CUDA probe in a subprocess and collect its readings.

The probe script (``cuda_probe_script.py``) is started by path with the kernel's own
interpreter, so it sees the same torch and the same environment (CUDA_VISIBLE_DEVICES),
but its CUDA context lives and dies in the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunb.readings.children import Child
from gpunb.readings.transaction import Transaction

SCRIPT = Path(__file__).with_name("cuda_probe_script.py")


@dataclass
class ProbeResult:
    """What the child process reported; ``error`` says why it could not finish."""

    facts: dict[str, Any] | None = None
    results: dict[tuple[str, int | None], dict[str, Any]] = field(default_factory=dict)  # (step, device) -> numbers
    errors: dict[tuple[str, int | None], str] = field(default_factory=dict)  # (step, device) -> message
    error: str | None = None
    duration_s: float = 0.0
    # (event, step, device, seconds since the child started)
    timeline: list[tuple[Any, ...]] = field(default_factory=list)

    def result(self, step: str, device: int | None) -> dict[str, Any] | None:
        return self.results.get((step, device))

    def step_error(self, step: str, device: int | None) -> str | None:
        return self.errors.get((step, device))


def run_probe(
    *,
    environ: Mapping[str, str] | None = None,
    devices: list[int] | None = None,
    timeout_s: float = 180.0,
    on_step: Callable[[str, int | None], None] | None = None,
    python: str | None = None,
    owner: Transaction | None = None,
) -> ProbeResult:
    """Run the probe; ``on_step(step, device)`` is called as each measurement starts. The
    process (its whole group) ends when this returns or raises, or when ``owner`` closes
    first (the check was interrupted while this runs in another thread)."""
    cmd = [python or sys.executable, str(SCRIPT)]
    if devices is not None:
        cmd.append("--devices=" + ",".join(map(str, devices)))
    env = dict(os.environ if environ is None else environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    out = ProbeResult()
    t0 = time.monotonic()
    child = Child("the CUDA probe")
    if owner is not None:
        owner.add(child.cancel)  # registered before the start: the owner's close ends it at any point
    try:  # from here on, whatever ends this (an exception, a Ctrl-C) ends the process group too
        _run(child, cmd, env, timeout_s, on_step, out)
    finally:
        child.end()
    out.duration_s = time.monotonic() - t0
    return out


def _run(child: Child, cmd: list[str], env: dict[str, str], timeout_s: float,
         on_step: Callable[[str, int | None], None] | None, out: ProbeResult) -> None:
    # stderr goes to a file: a chatty library must not fill a pipe and stall the child.
    with tempfile.TemporaryFile(mode="w+") as stderr_file:
        try:
            proc = child.start(cmd, stdout=subprocess.PIPE, stderr=stderr_file, text=True, env=env)
        except OSError as exc:
            out.error = f"could not start {cmd[0]}: {exc}"
            return
        # A hung driver blocks the child's output; the timer kills it so reading ends.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            child.end()

        killer = threading.Timer(timeout_s, expire)
        killer.daemon = True
        done = False
        try:
            killer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                if _handle(line, out, on_step):
                    done = True  # the last line: what the probe started may still hold the pipe open
                    break
            proc.wait()
        finally:
            timed_out = expired.is_set() and not done
            killer.cancel()
            child.end()
            if proc.stdout is not None:
                proc.stdout.close()
        if child.cancelled and not done:
            out.error = "the CUDA probe was stopped (the check was interrupted)"
        elif timed_out:
            out.error = (f"the CUDA probe did not finish within {timeout_s:.0f} s "
                         "(a hung driver, or a GPU busy with another job)")
        elif not done:
            stderr_file.seek(0)
            lines = [ln for ln in stderr_file.read().strip().splitlines() if ln.strip()]
            tail = " | ".join(lines[-3:]) if lines else f"exit code {proc.returncode}"
            out.error = f"the CUDA probe process died: {tail}"


def _handle(line: str, out: ProbeResult, on_step: Callable[[str, int | None], None] | None) -> bool:
    """Fold one protocol line into ``out``; True when it is the final "done"."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError:
        return False  # a library printed to stdout; not ours
    event: str | None = msg.pop("event", None)
    step, device = msg.pop("step", None), msg.pop("device", None)
    elapsed = msg.pop("elapsed_s", None)
    if elapsed is not None:
        out.timeline.append((event, step, device, elapsed))
    if event == "step" and on_step is not None:
        on_step(step, device)
    elif event == "facts":
        out.facts = msg
    elif event == "result":
        out.results[(step, device)] = msg
    elif event == "error":
        out.errors[(step, device)] = msg.get("error", "")
    return event == "done"
