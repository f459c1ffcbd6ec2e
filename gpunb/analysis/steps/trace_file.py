"""Where ``%%gpuprofile --ops`` puts its Chrome/Perfetto trace, written so that no other user
can redirect or read it.

torch's profiler can save a trace once (a second ``export_chrome_trace`` says "Trace is
already saved"), and it writes ``<name>.tmp`` first, following a symlink planted at that name.
So the directory is settled before torch writes anything: torch writes into a fresh private
directory (``mkdtemp``: 0700, unpredictable name) inside the notebook's directory, and the
finished file is renamed into place there (a rename never follows a symlink). When the
notebook's directory cannot take it (read-only, not a directory), the trace stays in a private
directory under the temp directory, 0600; in a directory others can write, the file is 0600
too. The note names the first problem met, not the last, and a path is reported only when it
is a regular file that torch wrote.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

PREFIX = "gpunb-trace-"


def _why(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def _shared(directory: Path) -> bool:
    try:
        return bool(os.stat(directory).st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        return True


def write_trace(save: Callable[[str], object], wanted: Path) -> tuple[str, int | None, str]:
    """Call ``save(path)`` once; (the trace's path, its size, a note) or ("", None, why not)."""
    first_problem = ""
    staging, final = None, wanted
    try:
        wanted.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=wanted.parent, prefix="." + PREFIX)
    except OSError as exc:
        first_problem = f"{wanted.parent} is not writable ({_why(exc)})"
    if staging is None:
        try:
            staging = tempfile.mkdtemp(prefix=PREFIX)
        except OSError as exc:
            return "", None, f"no trace file: {first_problem}, nor is the temp directory ({_why(exc)})"
        final = Path(staging) / wanted.name  # stays in its private directory
    inside = os.path.join(staging, wanted.name)
    try:
        save(inside)
        st = os.lstat(inside)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{inside} is not a regular file")
        if final != wanted or _shared(wanted.parent):
            os.chmod(inside, 0o600)  # others can reach this place: only this user reads the trace
    except Exception as exc:  # noqa: BLE001 (torch's own errors are RuntimeErrors)
        shutil.rmtree(staging, ignore_errors=True)
        problem = f"torch could not write it ({type(exc).__name__}: {exc})"
        return "", None, f"no trace file: {'; '.join(x for x in (first_problem, problem) if x)}"
    if final == wanted:
        try:
            os.replace(inside, wanted)
            os.rmdir(staging)
        except OSError as exc:  # e.g. another user's file by that name in a sticky directory
            return inside, st.st_size, f"written to {staging} ({wanted} could not be replaced: {_why(exc)})"
        return str(wanted), st.st_size, ""
    return str(final), st.st_size, f"written to a private temp directory ({first_problem})"
