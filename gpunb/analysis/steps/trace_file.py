"""Where ``%%gpuprofile --ops`` puts its Chrome/Perfetto trace, written so that no other user
can redirect or read it.

torch's profiler can save a trace once (a second ``export_chrome_trace`` says "Trace is
already saved"), takes only a path, and writes ``<name>.tmp`` first with a plain ``open`` that
follows links. A private folder (0700) inside the notebook's folder is not enough by itself:
in a folder others can write without the sticky bit (a group-shared project folder, such a
``TMPDIR``) they can rename the private folder away and put a link to their own in its place,
and torch, handed a *path*, writes through it. So torch is handed a path through this
process's open descriptor of the private folder (``/proc/self/fd/<fd>/<name>``,
``untrusted_file.GuardedFolder``): renaming folders changes nothing it resolves to. The finished
file is checked (a regular file of this user's), made 0600,
and moved into place by descriptor without replacing anything there. When the notebook's folder
cannot take it (read-only, another user's, not a folder), the trace stays in a private folder under the temp
folder. The note names the first problem met, and a path is reported only for a regular file
that torch wrote.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpunb.readings.untrusted_file import GuardedFolder, NotWritten

PREFIX = "gpunb-trace-"


def _private_folder(where: Path | str) -> tuple[GuardedFolder | None, GuardedFolder | None, str]:
    """(the folder, a private folder made in it, '') or (…, None, why not). Another user's
    folder is refused: they could do anything with what gpunb leaves there."""
    try:
        folder = GuardedFolder.open(where, create=True)
    except NotWritten as exc:
        return None, None, str(exc)
    if folder.foreign:
        folder.close()
        return None, None, folder.problem
    try:
        return folder, folder.private_folder("." + PREFIX if where != tempfile.gettempdir() else PREFIX), ""
    except NotWritten as exc:
        folder.close()
        return None, None, str(exc)


def _finish(staging: GuardedFolder, name: str) -> int:
    """The size of the regular file torch wrote as ``name``, made 0600 (a trace names the user's
    files and functions: only this user reads it, whatever the umask)."""
    st = staging.lstat(name)
    if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise OSError(f"{name} is not a regular file of this user's")
    staging.make_private(name)
    return st.st_size


def write_trace(save: Callable[[str], object], wanted: Path) -> tuple[str, int | None, str]:
    """Call ``save(path)`` once; (the trace's path, its size, a note) or ("", None, why not)."""
    folder, staging, first_problem = _private_folder(wanted.parent)
    in_place = staging is not None
    if staging is None:
        temp, staging, why = _private_folder(tempfile.gettempdir())
        if temp is not None:
            temp.close()
        if staging is None:
            return "", None, f"no trace file: {first_problem}, nor is the temp directory ({why})"
    try:
        try:
            save(staging.path_of(wanted.name))
            size = _finish(staging, wanted.name)
        except Exception as exc:  # noqa: BLE001 (torch's own errors are RuntimeErrors)
            staging.remove()
            problem = f"torch could not write it ({type(exc).__name__}: {exc})"
            return "", None, f"no trace file: {'; '.join(x for x in (first_problem, problem) if x)}"
        if not in_place or folder is None:
            staging.close()  # the trace stays in its private folder
            return (os.path.join(staging.name, wanted.name), size,
                    f"written to a private temp directory ({first_problem})")
        try:
            staging.place(wanted.name, folder, wanted.name)
        except NotWritten as exc:  # a file by that name is there already, or no hard links here
            return _kept_privately(staging, wanted.name, size, str(exc))
        staging.remove()
        note = f"others can rename or replace files in {wanted.parent} (no sticky bit)" if folder.problem else ""
        return str(wanted), size, note
    finally:
        if folder is not None:
            folder.close()



def _kept_privately(staging: GuardedFolder, name: str, size: int, why: str) -> tuple[str, int | None, str]:
    """The trace could not be put in place: name it in its private folder while that folder's name
    still leads to it; else (someone renamed it away) copy it into a private temp folder."""
    if staging.still_named():
        staging.close()
        return os.path.join(staging.name, name), size, f"written to {staging.name} ({why})"
    temp, private, problem = _private_folder(tempfile.gettempdir())
    try:
        if private is None:
            return "", None, f"no trace file: {why}, and the temp directory cannot take it ({problem})"
        try:
            staging.copy_to(name, private, name)
        except NotWritten as exc:
            private.remove()
            return "", None, f"no trace file: {why}; {exc}"
        private.close()
        return (os.path.join(private.name, name), size,
                f"written to a private temp directory ({why}; its folder next to the notebook was moved by someone)")
    finally:
        staging.remove()
        if temp is not None:
            temp.close()
