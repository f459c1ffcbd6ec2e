"""The rank channel's directory: private to this user, and only the one the cell made.

A profiled cell's worker processes write their records into a temporary directory the kernel
made (``mkdtemp``: mode 0700). Its name sits in ``/tmp`` for anyone to see and stays in the
environment of any process that outlives the cell, so a second user could wait for the cell
to delete it, make a directory of the same name, and collect (or redirect) the records. So:

- the kernel names the directory by path *and* identity (``GPUNB_RANK_CHANNEL_ID``: device and
  inode); a worker opens it once (``O_DIRECTORY|O_NOFOLLOW``) and uses it only when it is that
  directory, this user's, mode 0700;
- before every write the open directory is checked again (``fstat``): still this user's, still
  0700, not deleted (a deleted directory has no links). Once it is gone the writer closes it
  and writes nothing more, ever: a directory made later under the same name is never used;
- a record is written relative to the open directory (``dir_fd``) into a new temporary file
  (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600: never an existing file, never through a symlink) and
  renamed over ``rank-<pid>.json`` inside it.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping

from gpunb.readings.untrusted_file import GuardedFolder

ENV_CHANNEL = "GPUNB_RANK_CHANNEL"
ENV_CHANNEL_ID = "GPUNB_RANK_CHANNEL_ID"
MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def problem(st: os.stat_result, expected_id: str | None = None) -> str:
    """Why a directory with status ``st`` is not the channel ('' when it is)."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not this user"
    if stat.S_IMODE(st.st_mode) != MODE:
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not {MODE:04o}"
    if st.st_nlink == 0:
        return "deleted (the cell that made it has ended)"
    if expected_id is not None and identity(st) != expected_id:
        return "not the directory the cell made (same name, another directory)"
    return ""


def open_dir(path: str, expected_id: str | None) -> int | None:
    """The channel directory, opened once, or None when ``path`` is not it."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:  # gone, or a symlink
        return None
    try:
        if problem(os.fstat(fd), expected_id):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return fd


def from_environ(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(path, identity) of the channel named in the environment, if both are there."""
    env = os.environ if environ is None else environ
    path, ident = env.get(ENV_CHANNEL), env.get(ENV_CHANNEL_ID)
    return (path, ident) if path and ident else None


class ChannelWriter:
    """One worker's handle on the channel directory."""

    def __init__(self, path: str, expected_id: str | None) -> None:
        self.path = path
        self._fd = open_dir(path, expected_id)
        self._lock = threading.RLock()  # write() checks, and may close, under it

    @property
    def open(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def usable(self) -> bool:
        """Still the private directory the cell made; closes it for good when not."""
        fd = self._fd
        if fd is None:
            return False
        try:
            bad = problem(os.fstat(fd))
        except OSError:
            bad = "unreadable"
        if bad:
            self.close()
            return False
        return True

    def write(self, name: str, data: str) -> bool:
        """Replace ``name`` in the directory by ``data``; False when nothing was written."""
        with self._lock:
            fd = self._fd
            if fd is None or not self.usable():
                return False
            GuardedFolder.borrow(fd, self.path).replace(name, data.encode())  # O_EXCL|O_NOFOLLOW, 0600, renamed
            return True
