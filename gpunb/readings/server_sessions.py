"""From inside a notebook kernel: find the Jupyter server that runs it, and ask it (through
gpunb's server extension) which notebook holds each GPU process.

How a kernel finds its server: a running Jupyter server writes ``jpserver-<pid>.json``
(url, token, pid) into its runtime directory, the same directory that holds the kernel's
connection file ``kernel-<id>.json``. The server that owns this kernel is the one whose PID
is among the kernel's ancestors (a local kernel is the server's child, or its grandchild when
a wrapper such as ``bash -c "... ipykernel ..."`` started it); only when none is, the one whose
``/api/kernels/<id>`` knows this kernel id. VS Code's own kernels, terminal
IPython and Colab have no such server: then there is nothing to ask, and callers fall back
to PIDs.

Everything is lazy, cached and bounded: discovery happens on first use, a request never
waits longer than its timeout, failures are remembered for a while instead of retried on
every redraw, and :meth:`ServerSessions.latest` never blocks (it refreshes in a short-lived
background thread). Requests bypass HTTP proxies: the token must go to the server only.

What is trusted (docs/security.md): a runtime directory may be shared (mode 1777 on some
hubs), so a ``jpserver-*.json`` counts only when this user owns it and nobody else can write it
or its directory; it is read as untrusted (``untrusted_file``: no symlinks, FIFOs or huge files,
fields type-checked); its process must be this user's, alive, and no younger than the file, and
every socket on its port this user's (``server_trust``: a dead server's PID or port taken over
by another user gets nothing); its URL must be loopback (or the host this kernel's connection
file names); the token sent is the file's own, never ``JUPYTERHUB_API_TOKEN``; redirects are
not followed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunb.readings.server_trust import ancestors, port_problem, process_problem
from gpunb.readings.untrusted_file import Untrusted, check_private_dir, read_json, read_json_stat

API_PATH = "gpunb/api/gpus"
FIND_TIMEOUT_S = 0.5  # per server asked "is this kernel yours?"
RETRY_AFTER_S = 60.0  # after "no server" or a failed request, look again this much later
THREAD_NAME = "gpunb-server-link"
MAX_ANSWER_BYTES = 64 << 20  # the report for 60,000 GPU processes is ~30 MiB
_KERNEL_FILE = re.compile(r"kernel-(.+)\.json$")


@dataclass(frozen=True)
class ServerLink:
    """The Jupyter server that runs this kernel."""

    url: str  # base URL, ending in "/"
    token: str
    server_pid: int | None
    kernel_id: str
    found_by: str  # "parent process", "ancestor process" or "kernel listed by the server"


@dataclass(frozen=True)
class NoServer:
    """Why there is no server to ask (falsy)."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class ServerReading:
    """What the server said (``data``: the ``/gpunb/api/gpus`` JSON), or why nothing."""

    data: dict[str, Any] | None
    kernel_id: str = ""
    url: str = ""
    reason: str = ""
    fetched_at: float = 0.0  # monotonic clock

    def __bool__(self) -> bool:
        return self.data is not None


class ServerError(Exception):
    """A request to the server failed; the message says why in words."""


# -- discovery ----------------------------------------------------------------------------

def kernel_connection_file() -> str | None:
    """This kernel's connection file, if this process is an ipykernel (never imports it)."""
    app_module = sys.modules.get("ipykernel.kernelapp")
    if app_module is not None:
        app_class = getattr(app_module, "IPKernelApp", None)
        try:
            if app_class is not None and app_class.initialized():
                found = app_class.instance().abs_connection_file or app_class.instance().connection_file
                if found:
                    return str(found)
        except Exception:  # an odd kernel app: fall back to the command line
            pass
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg in ("-f", "--f") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("-f=", "--f=")):
            return arg.split("=", 1)[1]
    return None


MAX_SERVER_FILE_BYTES = 64 * 1024
MAX_PID = 2**31 - 1  # Linux caps PIDs at 2**22; anything past a C int is not a PID
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "ip6-localhost")
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "localhost"}  # listening everywhere: here too


@dataclass(frozen=True)
class _ServerFile:
    path: str
    url: str  # the base URL to use (a wildcard host replaced by loopback)
    token: str
    pid: int


def _trusted_dir(d: Path, notes: list[str]) -> bool:
    """A runtime directory is trusted only when this user owns it and nobody else can write to
    it: in a shared one (mode 1777) another user could plant a server file."""
    problem = check_private_dir(d)
    if problem and os.path.isdir(d):
        notes.append(f"server files in {d} were not trusted: {problem}")
    return not problem


def _server_files(dirs: list[Path], allowed_hosts: tuple[str, ...] = (), notes: list[str] | None = None,
                  ) -> list[_ServerFile]:
    """The live servers' files in ``dirs`` that this user wrote (owned, not writable by others,
    in a directory with the same property), schema-checked, naming a local host."""
    notes = [] if notes is None else notes
    seen, out = set(), []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        names = [n for n in names if n.startswith("jpserver-") and n.endswith(".json") and (d / n) not in seen]
        if not names or not _trusted_dir(d, notes):
            continue
        for name in names:
            seen.add(d / name)
            try:
                info, st = read_json_stat(d / name, owned=True, max_bytes=MAX_SERVER_FILE_BYTES)
            except Untrusted as exc:
                notes.append(f"ignored: {exc}")
                continue
            found = _server_file(str(d / name), info, allowed_hosts, notes)
            if found is None:
                continue
            problem = process_problem(found.pid, st.st_mtime) or port_problem(urllib.parse.urlsplit(found.url).port)
            if problem:
                notes.append(f"ignored: {d / name}: {problem}")
                continue
            out.append(found)
    return out


def _server_file(path: str, info: dict[str, Any], allowed_hosts: tuple[str, ...],
                 notes: list[str]) -> _ServerFile | None:
    pid, url, token = info.get("pid"), info.get("url"), info.get("token", "")
    if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= MAX_PID) \
            or not isinstance(url, str) or not isinstance(token, (str, type(None))):
        notes.append(f"ignored: {path} is not a Jupyter server file (pid, url or token of the wrong type)")
        return None
    if info.get("sock"):
        return None  # a UNIX socket server: urllib cannot reach it
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    host = (parts.hostname or "").lower()
    if host in WILDCARD_HOSTS:
        netloc = WILDCARD_HOSTS[host] if ":" not in WILDCARD_HOSTS[host] else f"[{WILDCARD_HOSTS[host]}]"
        parts = parts._replace(netloc=f"{netloc}:{parts.port}" if parts.port else netloc)
    elif not (_loopback(host) or host in allowed_hosts):
        notes.append(f"ignored: {path} names the host {host!r}, neither loopback nor the host this kernel's "
                     "connection file names; gpunb sends its token to neither")
        return None
    base = urllib.parse.urlunsplit(parts)
    return _ServerFile(path, base if base.endswith("/") else base + "/", token or "", pid)


def _loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _runtime_dirs(connection_file: str | None, runtime_dir: str | None) -> list[Path]:
    dirs = []
    if connection_file:
        dirs.append(Path(connection_file).resolve().parent)
    if runtime_dir:
        dirs.append(Path(runtime_dir))
    else:
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            dirs.append(Path(jupyter_runtime_dir()))
        except Exception:  # jupyter_core missing: only the connection file's directory
            pass
    return dirs


def _connection_host(connection_file: str) -> tuple[str, ...]:
    """The host this kernel's own connection file names (``ip``), when the file is this user's."""
    try:
        ip = read_json(connection_file, owned=True, max_bytes=MAX_SERVER_FILE_BYTES).get("ip")
    except Untrusted:
        return ()
    return (ip.lower(),) if isinstance(ip, str) and ip and ip not in WILDCARD_HOSTS else ()


def find_server(
    *,
    connection_file: str | None = None,
    runtime_dir: str | None = None,
    parent_pid: int | None = None,
    timeout_s: float = FIND_TIMEOUT_S,
    opener: Any = None,
) -> ServerLink | NoServer:
    """The server that runs this kernel, or why none was found. Only a server file this user
    wrote for a live server of this user's is believed, and its token goes only to a local URL
    whose port this user holds (see ``_server_files``); the server is looked for among the
    kernel's ancestors (from ``parent_pid`` up) before any server is asked about this kernel; a
    file without a token (a JupyterHub single-user server) gets no credential at all: gpunb
    never sends ``JUPYTERHUB_API_TOKEN`` to a URL a file names."""
    connection_file = connection_file or kernel_connection_file()
    if not connection_file:
        return NoServer("this is not a Jupyter kernel (terminal IPython or plain Python): no server to ask")
    m = _KERNEL_FILE.search(os.path.basename(connection_file))
    if not m:
        return NoServer(f"the kernel's connection file {os.path.basename(connection_file)!r} does not carry a "
                        "Jupyter server's kernel id (VS Code and other frontends start kernels themselves)")
    kernel_id = m.group(1)
    notes: list[str] = []
    servers = _server_files(_runtime_dirs(connection_file, runtime_dir), _connection_host(connection_file), notes)
    why = f" ({'; '.join(notes[:2])})" if notes else ""
    if not servers:
        return NoServer(f"no running Jupyter server was found in the runtime directory (jpserver-*.json){why}")
    lineage = ancestors(os.getppid() if parent_pid is None else parent_pid)
    by_pid = {found.pid: found for found in servers}
    for pid in lineage:  # nearest first: the parent, then (a kernel started by a wrapper) further up
        if (found := by_pid.get(pid)) is not None:
            how = "parent process" if pid == lineage[0] else "ancestor process"
            return ServerLink(found.url, found.token, found.pid, kernel_id, how)
    for found in servers:  # no ancestor (a kernel started elsewhere): ask who knows our id
        if not found.token:
            continue  # nothing to prove it is ours, and no login to ask with
        link = ServerLink(found.url, found.token, found.pid, kernel_id, "kernel listed by the server")
        try:
            get_json(link, f"api/kernels/{kernel_id}", timeout_s, opener)
        except ServerError:
            continue
        return link
    return NoServer(f"none of the {len(servers)} running Jupyter server(s) here runs this kernel{why}")


def link_problem(link: ServerLink) -> str:
    """Why ``link`` may no longer lead to this user's server ('' when it does), checked again
    before every request: the server may have died after it was found, and another user may
    hold its PID or its port by now."""
    if link.server_pid is not None and (problem := process_problem(link.server_pid, float("inf"))):
        return problem
    return port_problem(urllib.parse.urlsplit(link.url).port)


# -- requests -------------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would carry the ``Authorization`` header (urllib
    copies it) to wherever the answer points."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def get_json(link: ServerLink, path: str, timeout_s: float, opener: Any = None) -> Any:
    """GET ``<server>/<path>`` with the server's token; the JSON body, or :class:`ServerError`.
    The server's PID and port are checked first, every time (:func:`link_problem`)."""
    if problem := link_problem(link):  # the server died since; its PID or port may be another user's now
        raise ServerError(f"the Jupyter server at {link.url} was not asked: {problem}")
    request = urllib.request.Request(link.url + path, headers={"Accept": "application/json"})
    if link.token:
        request.add_header("Authorization", f"token {link.token}")
    try:
        with (opener or _NO_PROXY).open(request, timeout=timeout_s) as response:
            body = response.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            raise ServerError(f"the Jupyter server at {link.url} sent more than {MAX_ANSWER_BYTES >> 20} MiB")
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and path.startswith("gpunb/"):
            raise ServerError(f"the Jupyter server at {link.url} does not run gpunb's server extension "
                              "(enable it: `jupyter server extension enable gpunb`, then restart the server)") from None
        if 300 <= exc.code < 400:
            raise ServerError(f"the Jupyter server at {link.url} answered with a redirect (HTTP {exc.code}); gpunb "
                              "does not follow it, so its token goes nowhere else") from None
        if exc.code in (401, 403):
            raise ServerError(f"the Jupyter server at {link.url} refused gpunb's request (HTTP {exc.code}): it "
                              "needs a login this kernel does not have") from None
        raise ServerError(f"the Jupyter server at {link.url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:  # refused, timed out, TLS
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"the Jupyter server at {link.url} did not answer within {timeout_s:g} s "
                          f"({reason})") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise ServerError(f"the Jupyter server at {link.url} sent something that is not JSON") from None
    if not isinstance(data, dict):
        raise ServerError(f"the Jupyter server at {link.url} sent unexpected JSON")
    return data


class ServerSessions:
    """This kernel's cached view of its server's ``/gpunb/api/gpus``.

    ``latest()`` is for redraw loops (returns at once, refreshes in the background);
    ``get()`` is for one-off reports (waits up to its timeout)."""

    def __init__(
        self,
        find: Callable[[], ServerLink | NoServer] = find_server,
        fetch: Callable[[ServerLink, str, float], Any] = get_json,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 1.5,
    ) -> None:
        self._find = find
        self._fetch = fetch
        self._clock = clock
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._link: ServerLink | NoServer | None = None
        self._link_at = 0.0
        self._reading = ServerReading(None, reason="not asked yet")
        self._worker: threading.Thread | None = None
        self._closed = False

    def _current_link(self) -> ServerLink | NoServer:
        with self._lock:
            link, at = self._link, self._link_at
        if link is None or (not link and self._clock() - at >= RETRY_AFTER_S):
            try:
                link = self._find()
            except Exception as exc:  # noqa: BLE001 (an odd runtime directory costs the attribution only)
                link = NoServer(f"the Jupyter server could not be looked up ({type(exc).__name__}: {exc})")
            with self._lock:
                self._link, self._link_at = link, self._clock()
        return link

    def refresh(self) -> ServerReading:
        """Ask the server now (blocking up to the request timeout)."""
        link = self._current_link()
        now = self._clock()
        if isinstance(link, NoServer):
            reading = ServerReading(None, reason=link.reason, fetched_at=now)
        else:
            try:
                data = self._fetch(link, API_PATH, self.request_timeout_s)
                reading = ServerReading(data, link.kernel_id, link.url, fetched_at=now)
            except Exception as exc:  # noqa: BLE001 (ServerError, or an answer cut short: never a thread traceback)
                why = str(exc) if isinstance(exc, ServerError) else \
                    f"the Jupyter server at {link.url} sent a broken answer ({type(exc).__name__}: {exc})"
                reading = ServerReading(None, link.kernel_id, link.url, reason=why, fetched_at=now)
                with self._lock:  # find it again later: the server may have restarted elsewhere
                    self._link, self._link_at = NoServer(why), now
        with self._lock:
            self._reading = reading
        return reading

    def _stale(self, max_age_s: float) -> bool:
        r = self._reading
        if r.reason == "not asked yet":
            return True
        age = self._clock() - r.fetched_at
        return age >= (max_age_s if r else max(max_age_s, RETRY_AFTER_S))

    def latest(self, max_age_s: float = 10.0) -> ServerReading:
        """The last reading at once; a stale one starts a background refresh."""
        with self._lock:
            reading = self._reading
            busy = self._worker is not None and self._worker.is_alive()
            if not busy and not self._closed and self._stale(max_age_s):
                self._worker = threading.Thread(target=self.refresh, name=THREAD_NAME, daemon=True)
                self._worker.start()
        return reading

    def get(self, max_age_s: float = 5.0) -> ServerReading:
        """A reading no older than ``max_age_s`` if the server answers within the timeout."""
        with self._lock:
            worker = self._worker
            fresh = not self._stale(max_age_s)
            reading = self._reading
        if fresh:
            return reading
        if worker is not None and worker.is_alive():
            worker.join(self.request_timeout_s + FIND_TIMEOUT_S)
            with self._lock:
                if not self._stale(max_age_s):
                    return self._reading
        return self.refresh()

    def close(self) -> None:
        """Wait for a refresh in flight (it ends within its timeout); no new ones start."""
        with self._lock:
            self._closed = True
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(self.request_timeout_s + FIND_TIMEOUT_S * 4)

    def reopen(self) -> None:
        with self._lock:
            self._closed = False


_default_lock = threading.Lock()
_default: ServerSessions | None = None


def default_sessions() -> ServerSessions:
    """The process-wide instance (one per kernel)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ServerSessions()
        return _default


def set_default_sessions(sessions: ServerSessions | None) -> None:
    """Replace the process-wide instance (tests; ``None`` starts afresh on next use)."""
    global _default
    with _default_lock:
        old, _default = _default, sessions
    if old is not None and old is not sessions:
        old.close()
