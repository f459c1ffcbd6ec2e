"""From inside a notebook kernel: find the Jupyter server that runs it, and ask it (through
gpunb's server extension) which notebook holds each GPU process.

How a kernel finds its server: a running Jupyter server writes ``jpserver-<pid>.json``
(url, token, pid) into its runtime directory, the same directory that holds the kernel's
connection file ``kernel-<id>.json``. The server that owns this kernel is the one whose PID
is the kernel's parent process (a local kernel is the server's child); failing that, the
one whose ``/api/kernels/<id>`` knows this kernel id. VS Code's own kernels, terminal
IPython and Colab have no such server: then there is nothing to ask, and callers fall back
to PIDs.

Everything is lazy, cached and bounded: discovery happens on first use, a request never
waits longer than its timeout, failures are remembered for a while instead of retried on
every redraw, and :meth:`ServerSessions.latest` never blocks (it refreshes in a short-lived
background thread). Requests bypass HTTP proxies: the token must go to the server only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_PATH = "gpunb/api/gpus"
FIND_TIMEOUT_S = 0.5  # per server asked "is this kernel yours?"
RETRY_AFTER_S = 60.0  # after "no server" or a failed request, look again this much later
THREAD_NAME = "gpunb-server-link"
_KERNEL_FILE = re.compile(r"kernel-(.+)\.json$")


@dataclass(frozen=True)
class ServerLink:
    """The Jupyter server that runs this kernel."""

    url: str  # base URL, ending in "/"
    token: str
    server_pid: int | None
    kernel_id: str
    found_by: str  # "parent process" or "kernel listed by the server"


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


def _server_files(dirs: list[Path]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not (name.startswith("jpserver-") and name.endswith(".json")) or (d / name) in seen:
                continue
            seen.add(d / name)
            try:
                info = json.loads((d / name).read_text())
            except (OSError, ValueError):  # being written, or not ours to read
                continue
            pid = info.get("pid")
            if isinstance(info, dict) and isinstance(pid, int) and _alive(pid):
                out.append(info)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    except OSError:
        return False
    return True


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


def _token(info: dict[str, Any]) -> str:
    # A JupyterHub single-user server writes no token; its kernels inherit the server's
    # API token, which the server accepts for its own user.
    return str(info.get("token") or os.environ.get("JUPYTERHUB_API_TOKEN") or "")


def find_server(
    *,
    connection_file: str | None = None,
    runtime_dir: str | None = None,
    parent_pid: int | None = None,
    timeout_s: float = FIND_TIMEOUT_S,
    opener: Any = None,
) -> ServerLink | NoServer:
    """The server that runs this kernel, or why none was found."""
    connection_file = connection_file or kernel_connection_file()
    if not connection_file:
        return NoServer("this is not a Jupyter kernel (terminal IPython or plain Python): no server to ask")
    m = _KERNEL_FILE.search(os.path.basename(connection_file))
    if not m:
        return NoServer(f"the kernel's connection file {os.path.basename(connection_file)!r} does not carry a "
                        "Jupyter server's kernel id (VS Code and other frontends start kernels themselves)")
    kernel_id = m.group(1)
    servers = _server_files(_runtime_dirs(connection_file, runtime_dir))
    if not servers:
        return NoServer("no running Jupyter server was found in the runtime directory (jpserver-*.json)")
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    usable = []
    for info in servers:
        url, token = str(info.get("url") or ""), _token(info)
        if info.get("sock") or not url.startswith(("http://", "https://")):
            continue
        link = ServerLink(url if url.endswith("/") else url + "/", token, info.get("pid"), kernel_id, "")
        if info.get("pid") == parent_pid:
            return _with(link, "parent process")
        usable.append(link)
    for link in usable:  # not our parent (a kernel started by a wrapper): ask who knows our id
        try:
            get_json(link, f"api/kernels/{kernel_id}", timeout_s, opener)
        except ServerError:
            continue
        return _with(link, "kernel listed by the server")
    return NoServer(f"none of the {len(servers)} running Jupyter server(s) here runs this kernel "
                    "(or they listen on a UNIX socket)")


def _with(link: ServerLink, how: str) -> ServerLink:
    return ServerLink(link.url, link.token, link.server_pid, link.kernel_id, how)


# -- requests -------------------------------------------------------------------------------

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(link: ServerLink, path: str, timeout_s: float, opener: Any = None) -> Any:
    """GET ``<server>/<path>`` with the server's token; the JSON body, or :class:`ServerError`."""
    request = urllib.request.Request(link.url + path, headers={"Accept": "application/json"})
    if link.token:
        request.add_header("Authorization", f"token {link.token}")
    try:
        with (opener or _NO_PROXY).open(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and path.startswith("gpunb/"):
            raise ServerError(f"the Jupyter server at {link.url} does not run gpunb's server extension "
                              "(enable it: `jupyter server extension enable gpunb`, then restart the server)") from None
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
            link = self._find()
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
            except ServerError as exc:
                reading = ServerReading(None, link.kernel_id, link.url, reason=str(exc), fetched_at=now)
                with self._lock:  # find it again later: the server may have restarted elsewhere
                    self._link, self._link_at = NoServer(str(exc)), now
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
