"""Reading a file another process could have written: the one way gpunb does it.

gpunb reads files it did not necessarily write itself: the peak cache (``matmul_peaks.json``,
possibly in a shared ``GPUNB_CACHE_DIR``), Jupyter's ``jpserver-*.json`` (a runtime directory
may be shared, mode 1777), and worker ``rank-*.json`` records. Any of them may be a symlink to
something else, a FIFO that blocks a plain ``open()`` forever, a huge file, another user's
file, or JSON of the wrong shape. Here such a file is opened without following symlinks and
without blocking, checked with ``fstat`` on the open descriptor (no race between the check and
the read), read up to a size cap, and parsed; anything wrong raises :class:`Untrusted` with a
sentence that names the file and the cause. Callers turn that into one note, never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

MAX_BYTES = 1 << 20  # no file gpunb reads this way is near 1 MiB (a rank record is ~40 KiB)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class Untrusted(Exception):
    """The file was not read; the message says which file and why, in words."""


def my_uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def private_problem(st: os.stat_result, what: str, *, uid: int | None = None) -> str:
    """Why a file or directory with status ``st`` is not safe to trust ('' when it is): it must
    belong to this user and be writable by nobody else."""
    uid = my_uid() if uid is None else uid
    if uid is not None and st.st_uid != uid:
        return f"{what} belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def read_bytes(path: str | os.PathLike[str], *, dir_fd: int | None = None, max_bytes: int = MAX_BYTES,
               owned: bool = False) -> bytes:
    """The content of the regular file ``path`` (relative to ``dir_fd`` when given). Never
    follows a symlink, never blocks on a FIFO or device, never reads past ``max_bytes``;
    ``owned``: the file must also be this user's and writable by nobody else."""
    name = os.fspath(path)
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if os.path.islink(name) if dir_fd is None else _is_link(name, dir_fd):
            raise Untrusted(f"{name} is a symbolic link; gpunb reads only regular files there") from None
        raise Untrusted(f"{name} could not be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{name} is not a regular file (a FIFO, device or directory); it was not read")
        if owned and (problem := private_problem(st, name)):
            raise Untrusted(problem)
        if st.st_size > max_bytes:
            raise Untrusted(f"{name} is {st.st_size} bytes, more than the {max_bytes} bytes such a file can be")
        chunks, left = [], max_bytes + 1
        while left > 0:
            try:
                chunk = os.read(fd, min(left, 1 << 16))
            except BlockingIOError:  # a regular file never blocks; be safe anyway
                break
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise Untrusted(f"{name} grew past {max_bytes} bytes while being read")
        return data
    except OSError as exc:
        raise Untrusted(f"{name} could not be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_json(path: str | os.PathLike[str], *, dir_fd: int | None = None, max_bytes: int = MAX_BYTES,
              owned: bool = False, expect: type = dict) -> Any:
    """:func:`read_bytes`, parsed as JSON whose top level is an ``expect`` (a dict by default)."""
    data = read_bytes(path, dir_fd=dir_fd, max_bytes=max_bytes, owned=owned)
    name = os.fspath(path)
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise Untrusted(f"{name} is not valid JSON (half-written, or not gpunb's)") from None
    if not isinstance(value, expect):
        raise Untrusted(f"{name} holds a JSON {type(value).__name__}, not the {expect.__name__} gpunb expects")
    return value


def check_private_dir(path: str | os.PathLike[str], *, strict_mode: int | None = None) -> str:
    """Why the directory ``path`` cannot be trusted ('' when it can): it must be a directory
    (not a symlink to one), this user's, and writable by nobody else; ``strict_mode`` (e.g.
    0o700) asks for exactly that mode."""
    name = os.fspath(path)
    try:
        st = os.lstat(name)
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{name} is not a directory (a symbolic link or a file)"
    if problem := private_problem(st, name):
        return problem
    if strict_mode is not None and stat.S_IMODE(st.st_mode) != strict_mode:
        return f"{name} has mode {stat.S_IMODE(st.st_mode):04o}, not {strict_mode:04o}"
    return ""


def is_number(value: Any) -> bool:
    """A JSON number that is a real number (not a bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and value not in (float("inf"), float("-inf"))
