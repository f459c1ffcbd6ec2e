"""A second local user for the security tests: a real uid, so the kernel's own permission checks
decide what the "attacker" can do (renaming in a folder, following a link), not gpunb's belief.

Needs root (CI runs as root): the attacker is the local user ``attacker`` when there is one
(``useradd -m attacker``), else ``nobody``. Each attacker step runs in a forked child that has
dropped to that uid; tests that need it skip cleanly when not root."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


def _attacker() -> tuple[int, int]:
    for name in ("attacker", "nobody"):
        try:
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            continue
    return 65534, 65534


ATTACKER_UID, ATTACKER_GID = _attacker()
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="a second uid needs root (CI runs as root)")


def as_attacker(step: Callable[[], object]) -> bool:
    """Run ``step`` as the other user in a forked child; True when it ran without an error (the
    kernel let the attacker do it)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.setgroups([])
            os.setgid(ATTACKER_GID)
            os.setuid(ATTACKER_UID)
            step()
            code = 0
        except BaseException:  # noqa: BLE001
            if os.environ.get("GPUNB_TEST_ATTACKER_TRACE"):
                traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@contextmanager
def reachable_folder() -> Iterator[str]:
    """A folder both users can reach (pytest's tmp_path is 0700 root's): under /tmp, 0755."""
    base = tempfile.mkdtemp(prefix="gpunb-two-users-", dir="/tmp")
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
