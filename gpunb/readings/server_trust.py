"""Is the server a ``jpserver-*.json`` names this user's live server, and is its port still its?

A server file outlives its server when the server is killed. Its PID is then free: another user
can take it (the review of issue 31 took one in 28,244 forks, 14.2 s) and its loopback port
too, and a kernel that believed the file would send the server's token to that listener and show
its answer as the truth. OpenSSH and Jupyter Server trust a file only after checking who owns
it; here the process and the port are checked as well, each from the kernel's own tables:

- the PID must be a live process **of this user** (``kill(pid, 0)`` answering ``EPERM`` means
  another user's process: stale, not alive), started no later than the file was written (a
  process started after it reuses the PID of a server that is gone);
- every socket listening on the file's port must belong to this user (``/proc/net/tcp`` and
  ``tcp6`` carry each socket's uid): a port another user holds gets no request, and so no token.

Without ``/proc`` (macOS) only ``kill`` and the owner of the file answer; the note says so.
"""

from __future__ import annotations

import os

from gpunb.readings.process_facts import AncestorCache, read_process_facts

START_SLACK_S = 1.0  # /proc's start time counts in clock ticks from a boot time in whole seconds
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_NET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def my_uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def process_problem(pid: int, written_unix: float, *, proc_root: str = "/proc") -> str:
    """Why ``pid`` is not the live server that wrote a file at ``written_unix`` ('' when it is)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process {pid} has exited"
    except PermissionError:
        return f"its process {pid} belongs to another user (the server is gone and its PID was reused)"
    except (OSError, OverflowError, ValueError):
        return f"its process {pid} cannot be checked"
    facts = read_process_facts(pid, proc_root, AncestorCache(proc_root))
    uid = my_uid()
    if not facts.exists:
        return f"its process {pid} has exited"
    if uid is not None and facts.uid is not None and facts.uid != uid:
        return f"its process {pid} belongs to another user (uid {facts.uid}): the server is gone and its PID was reused"
    if facts.create_time_unix is not None and facts.create_time_unix > written_unix + START_SLACK_S:
        return (f"its process {pid} started after the file was written (the server is gone and its PID was "
                "reused)")
    return ""


def _listeners(port: int, tables: tuple[str, ...]) -> list[int] | None:
    """The uids of the sockets listening on ``port`` (any local address); None without tables."""
    uids, read_any = [], False
    for table in tables:
        try:
            with open(table, "rb") as f:
                lines = f.read(16 << 20).splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3].decode() != _LISTEN:
                continue
            try:
                if int(fields[1].rsplit(b":", 1)[1], 16) == port:
                    uids.append(int(fields[7]))
            except (ValueError, IndexError):
                continue
    return uids if read_any else None


def port_problem(port: int | None, *, tables: tuple[str, ...] = _NET_TABLES) -> str:
    """Why a request to this machine's ``port`` might reach someone else ('' when every socket
    listening there is this user's)."""
    if port is None:
        return ""  # the scheme's default port (80/443): a server on it is not a user's kernel server
    uids = _listeners(port, tables)
    if uids is None:
        return ""  # no /proc/net (not Linux): the process checks above are what there is
    if not uids:
        return f"nothing listens on port {port} (the server is gone or not up yet)"
    uid = my_uid()
    others = sorted({u for u in uids if uid is not None and u != uid})
    if others:
        return f"port {port} is held by uid {others[0]}, not by this user: gpunb sends it nothing"
    return ""


def ancestors(parent_pid: int) -> tuple[int, ...]:
    """The kernel's parent, its parent, and so on (a kernel started through ``bash -c`` or a
    wrapper script is the server's grandchild), nearest first."""
    return AncestorCache().ancestors(parent_pid) if parent_pid > 0 else ()
