"""The one guarded place for the file system: every file gpunb writes, and every file it reads
from a place another user may write, goes through here (``tests/test_file_access_guard.py``
fails on a file-system call elsewhere that its allow-list does not name with a reason).

Reading. gpunb reads files it did not necessarily write itself: the peak cache
(``matmul_peaks.json``, possibly in a shared ``GPUNB_CACHE_DIR``), Jupyter's ``jpserver-*.json``
(a runtime directory may be shared, mode 1777), worker ``rank-*.json`` records. Any of them may
be a symlink, a FIFO that blocks a plain ``open()`` forever, a huge file, another user's file,
or JSON of the wrong shape. Such a file is opened without following symlinks and without
blocking, checked with ``fstat`` on the open descriptor (no race between the check and the
read), read up to a size cap, and parsed; numbers are checked finite and in range
(:func:`in_range`). Anything wrong raises :class:`Untrusted` with a sentence naming the file
and the cause; callers turn that into one note, never a traceback.

Writing (:class:`GuardedFolder`). A folder is opened once, by descriptor, and every name is
looked up relative to it: renaming the folder (or one above it) changes nothing. New files are
``O_CREAT | O_EXCL | O_NOFOLLOW``, 0600, and removed when the write fails. In a folder others can
write without the sticky bit they can rename anything, even a folder gpunb made there, so files
are staged in a private folder opened by descriptor, a library that takes only a path gets
``/proc/self/fd/<fd>/<name>``, and nothing is read back from such a folder.
"""
from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

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
    return read_bytes_stat(path, dir_fd=dir_fd, max_bytes=max_bytes, owned=owned)[0]


def read_bytes_stat(path: str | os.PathLike[str], *, dir_fd: int | None = None, max_bytes: int = MAX_BYTES,
                    owned: bool = False) -> tuple[bytes, os.stat_result]:
    """:func:`read_bytes` and the ``fstat`` of the descriptor it read (when the file was written:
    ``st_mtime``), with no race between the two."""
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
        return data, st
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
    return read_json_stat(path, dir_fd=dir_fd, max_bytes=max_bytes, owned=owned, expect=expect)[0]


def read_json_stat(path: str | os.PathLike[str], *, dir_fd: int | None = None, max_bytes: int = MAX_BYTES,
                   owned: bool = False, expect: type = dict) -> tuple[Any, os.stat_result]:
    """:func:`read_json` and the file's ``fstat`` (:func:`read_bytes_stat`)."""
    data, st = read_bytes_stat(path, dir_fd=dir_fd, max_bytes=max_bytes, owned=owned)
    name = os.fspath(path)
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise Untrusted(f"{name} is not valid JSON (half-written, or not gpunb's)") from None
    if not isinstance(value, expect):
        raise Untrusted(f"{name} holds a JSON {type(value).__name__}, not the {expect.__name__} gpunb expects")
    return value, st


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


def in_range(value: Any, low: float, high: float) -> bool:
    """A JSON number within ``[low, high]`` (finite; an integer of hundreds of digits is refused
    before ``float()`` would raise ``OverflowError`` on it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return False
    return is_number(value) and low <= value <= high


# -- writing, and reading inside one folder: the guarded folder -------------------------------------

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_ROOT_UID = 0


class NotWritten(Exception):
    """Nothing was written (and nothing half-written was left); the message says where and why."""


def folder_problem(st: os.stat_result, name: str, *, uid: int | None = None) -> str:
    """Why a folder with status ``st`` cannot hold files gpunb trusts ('' when it can): it must be
    a directory of this user (or root's, like ``/tmp``), and a folder others can write must have
    the sticky bit (without it, anyone who can write the folder can rename or replace what is in
    it, including a folder gpunb made there)."""
    uid = my_uid() if uid is None else uid
    if not stat.S_ISDIR(st.st_mode):
        return f"{name} is not a directory"
    if uid is not None and st.st_uid not in (uid, _ROOT_UID):
        return f"{name} belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"{name} is writable by other users without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o}): "
                "they can rename or replace anything in it")
    return ""


class GuardedFolder:
    """A folder opened once, by descriptor: every name below is looked up relative to it, so
    renaming the folder, or any folder above it, after it was opened changes nothing. Files are
    created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never through a link)
    and 0600; a write that fails removes what it wrote. Use as a context manager or ``close()``.

    ``trusted`` is '' when the folder itself may be believed (:func:`folder_problem`); an
    untrusted folder can still take a new file written through a private folder of gpunb's own
    (:meth:`private_folder`, :meth:`place`), never a file read back from it."""

    def __init__(self, fd: int, name: str, *, owns_name: str = "", parent: GuardedFolder | None = None,
                 borrowed: bool = False) -> None:
        self.fd = fd
        self.name = name
        self._borrowed = borrowed  # the caller's descriptor: close() leaves it open
        st = os.fstat(fd)
        # only this user can add, rename or remove entries: a temporary name here is safe
        self.private = not private_problem(st, name)
        self.identity = (st.st_dev, st.st_ino)
        self.problem = folder_problem(st, name)
        uid = my_uid()
        self.foreign = uid is not None and st.st_uid not in (uid, _ROOT_UID)  # another user's folder
        self._owns_name = owns_name  # made by us under ``parent``: removed by remove()
        self._parent = parent

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = False) -> GuardedFolder:
        """The folder at ``path`` (made 0700 first when ``create`` and missing); :class:`NotWritten`
        when it cannot be opened."""
        name = os.fspath(path)
        try:
            if create:
                os.makedirs(name, mode=0o700, exist_ok=True)
            fd = os.open(name, _DIR_FLAGS)
        except OSError as exc:
            raise NotWritten(f"{name} cannot be opened as a folder ({exc.strerror or exc})") from None
        try:
            return cls(fd, name)
        except BaseException:
            os.close(fd)
            raise

    def __enter__(self) -> GuardedFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def borrow(cls, fd: int, name: str) -> GuardedFolder:
        """A folder the caller already opened and checked (the rank channel); not closed here."""
        return cls(fd, name, borrowed=True)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0 and not self._borrowed:
            os.close(fd)

    def path_of(self, name: str) -> str:
        """A path to ``name`` here that no rename can redirect, for a library that takes only a
        path (torch's profiler): ``/proc/self/fd/<fd>/<name>``, which resolves through this
        process's open descriptor, not through folder names."""
        if os.sep in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a plain file name")
        proc = f"/proc/self/fd/{self.fd}"
        if not os.path.isdir(proc):
            raise NotWritten("this system has no /proc/self/fd: gpunb cannot hand a library a path no one can redirect")
        return f"{proc}/{name}"

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def read_json(self, name: str, *, max_bytes: int = MAX_BYTES, owned: bool = True, expect: type = dict) -> Any:
        """A JSON file here, read as :func:`read_json` does; refused in an untrusted folder."""
        if self.problem:
            raise Untrusted(f"{os.path.join(self.name, name)} was not read: {self.problem}")
        return read_json(name, dir_fd=self.fd, max_bytes=max_bytes, owned=owned, expect=expect)

    def write_new(self, name: str, data: bytes | Callable[[BinaryIO], object], *, mode: int = 0o600) -> int:
        """Create ``name`` here (it must not exist) with ``data`` (bytes, or a function that writes
        to the open file); its size in bytes. On any failure (a full disk, an interrupt) the file
        is removed and :class:`NotWritten` says why."""
        full = os.path.join(self.name, name)
        try:
            fd = os.open(name, _NEW_FILE, mode, dir_fd=self.fd)
        except FileExistsError:
            raise NotWritten(f"{full} already exists: choose a new name (gpunb never overwrites a file)") from None
        except OSError as exc:
            raise NotWritten(f"cannot create {full}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data)
                f.flush()
                return f.tell()
        except BaseException as exc:
            self._unlink_quietly(name)
            if isinstance(exc, OSError):
                raise NotWritten(f"{full} was not written ({exc.strerror or exc}); nothing was left behind") from None
            if isinstance(exc, Exception):  # e.g. pickle's own errors: a note, not a traceback
                raise NotWritten(f"{full} was not written ({type(exc).__name__}: {exc}); "
                                 "nothing was left behind") from None
            raise  # an interrupt stays an interrupt (the file is gone)

    def make_private(self, name: str) -> None:
        """Make the regular file ``name`` here 0600 (opened without following a link)."""
        fd = os.open(name, _OPEN_FLAGS, dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotWritten(f"{os.path.join(self.name, name)} is not a regular file")
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)

    def replace(self, name: str, data: bytes, *, mode: int = 0o600) -> int:
        """Put ``data`` at ``name`` here in one step (a reader sees the old file or the new one):
        written as a new file, then renamed into place (a rename replaces a planted link itself,
        never writes through it). In a folder only this user can change the new file sits
        beside the old one; elsewhere it is written inside a private folder of gpunb's own."""
        if self.private:
            tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            size = self.write_new(tmp, data, mode=mode)
            try:
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError as exc:
                self._unlink_quietly(tmp)
                raise NotWritten(f"{os.path.join(self.name, name)} was not replaced ({exc.strerror or exc})") from None
            return size
        staging = self.private_folder(".gpunb-write-")
        try:
            size = staging.write_new(name, data, mode=mode)
            staging.place(name, self, name, replace=True)
        finally:
            staging.remove()
        return size

    def private_folder(self, prefix: str) -> GuardedFolder:
        """A new folder here, 0700, opened by descriptor and checked to be the one made (this
        user's, 0700): what is inside cannot be touched by others even when this folder is
        shared, and renaming it away does not move what is written through it."""
        for _ in range(100):
            name = prefix + secrets.token_hex(6)
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise NotWritten(f"{self.name} is not writable ({exc.strerror or exc})") from None
            try:
                fd = os.open(name, _DIR_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=self.fd)
            except OSError as exc:
                raise NotWritten(f"the private folder made in {self.name} was swapped before it was opened "
                                 f"({exc.strerror or exc})") from None
            st = os.fstat(fd)
            uid = my_uid()
            if (uid is not None and st.st_uid != uid) or stat.S_IMODE(st.st_mode) & 0o077:
                os.close(fd)
                raise NotWritten(f"the private folder made in {self.name} was swapped for another before it was "
                                 "opened (another user can rename entries there)")
            return GuardedFolder(fd, os.path.join(self.name, name), owns_name=name, parent=self)
        raise NotWritten(f"no free name for a private folder in {self.name}")

    def place(self, name: str, target: GuardedFolder, target_name: str, *, replace: bool = False) -> None:
        """Move ``name`` from here into ``target`` (both by descriptor). Without ``replace`` an
        existing ``target_name`` is kept (a hard link, which fails on an existing name, as
        ``O_EXCL`` does); with it, the entry is replaced by a rename (a link planted there is
        replaced itself, never followed)."""
        st = self.lstat(name)
        if not stat.S_ISREG(st.st_mode):
            raise NotWritten(f"{os.path.join(self.name, name)} is not a regular file")
        try:
            if replace:
                os.replace(name, target_name, src_dir_fd=self.fd, dst_dir_fd=target.fd)
                return
            os.link(name, target_name, src_dir_fd=self.fd, dst_dir_fd=target.fd, follow_symlinks=False)
        except FileExistsError:
            raise NotWritten(f"{os.path.join(target.name, target_name)} already exists (gpunb never overwrites "
                             "a file there)") from None
        except OSError as exc:
            raise NotWritten(f"{os.path.join(target.name, target_name)} could not be put in place "
                             f"({exc.strerror or exc})") from None
        self._unlink_quietly(name)

    def still_named(self) -> bool:
        """For a folder :meth:`private_folder` made: its name still leads to it (nobody renamed it
        away and put something else there), so its path may be shown to the user."""
        parent, name = self._parent, self._owns_name
        if parent is None or not name or parent.fd < 0:
            return False
        try:
            st = parent.lstat(name)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def copy_to(self, name: str, target: GuardedFolder, target_name: str) -> int:
        """Copy the regular file ``name`` here into a new file in ``target`` (by descriptors)."""
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise NotWritten(f"{os.path.join(self.name, name)} could not be opened ({exc.strerror or exc})") from None
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotWritten(f"{os.path.join(self.name, name)} is not a regular file")
            return target.write_new(target_name, lambda out: _copy(source, out))

    def remove(self) -> None:
        """Empty and remove a folder :meth:`private_folder` made (by descriptor; only regular files
        and links inside it are removed, never followed), then close it."""
        if self.fd < 0:
            return
        for entry in os.listdir(self.fd):
            self._unlink_quietly(entry)
        parent, name = self._parent, self._owns_name
        if parent is not None and name and parent.fd >= 0:
            try:  # only while the name is still this folder (it may have been renamed away)
                if (st := parent.lstat(name)) and (st.st_dev, st.st_ino) == self.identity:
                    os.rmdir(name, dir_fd=parent.fd)
            except OSError:
                pass
        self.close()

    def _unlink_quietly(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass


def _copy(source: BinaryIO, out: BinaryIO) -> None:
    while chunk := source.read(1 << 20):
        out.write(chunk)
