"""How a kernel finds the Jupyter server that runs it and asks it, without ever hanging a
caller: runtime files, the parent-process rule, a token sent to that server only (never
through a proxy), answers and failures cached. The HTTP server here is a tiny stand-in;
the real server is in ``tests/server``."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from gpunb.readings import server_sessions as ss

KERNEL_ID = "0b4b8f4e-7a0c-4d8e-9a43-1f2e3d4c5b6a"
TOKEN = "secret-token"


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def stand_in():
    """A server that answers like jupyter_server: its kernel, gpunb's API, 403 without the token."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
            if self.headers.get("Authorization") != f"token {TOKEN}":
                code, body = 403, {"message": "Forbidden"}
            elif self.path == f"/base/api/kernels/{KERNEL_ID}":
                code, body = 200, {"id": KERNEL_ID}
            elif self.path == "/base/gpunb/api/gpus":
                code, body = 200, {"t_unix": time.time(), "gpus": [], "kernels": [], "notes": []}
            else:
                code, body = 404, {"message": "Not Found"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/base/", seen
    server.shutdown()
    server.server_close()


def _runtime(tmp_path, url: str, pid: int, token: str = TOKEN, **extra) -> str:
    (tmp_path / f"jpserver-{pid}.json").write_text(json.dumps({"url": url, "token": token, "pid": pid, **extra}))
    connection = tmp_path / f"kernel-{KERNEL_ID}.json"
    connection.write_text("{}")
    return str(connection)


@pytest.fixture
def another_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def test_the_parent_process_is_the_server(tmp_path, stand_in):
    url, _ = stand_in
    connection = _runtime(tmp_path, url, os.getpid())
    link = ss.find_server(connection_file=connection, parent_pid=os.getpid(), runtime_dir=str(tmp_path))
    assert link and (link.url, link.kernel_id, link.found_by) == (url, KERNEL_ID, "parent process")


def test_otherwise_the_server_that_knows_this_kernel(tmp_path, stand_in, another_process):
    url, seen = stand_in
    connection = _runtime(tmp_path, url, another_process)
    link = ss.find_server(connection_file=connection, parent_pid=1, runtime_dir=str(tmp_path))
    assert link and link.found_by == "kernel listed by the server"
    assert seen[-1] == {"path": f"/base/api/kernels/{KERNEL_ID}", "auth": f"token {TOKEN}"}
    wrong = _runtime(tmp_path, url, another_process, token="other")
    assert not ss.find_server(connection_file=wrong, parent_pid=1, runtime_dir=str(tmp_path))


def test_no_server_says_why(tmp_path, stand_in, monkeypatch):
    url, _ = stand_in
    monkeypatch.setattr(sys, "argv", ["ipython"])  # terminal IPython: no connection file
    assert "not a Jupyter kernel" in ss.find_server().reason
    vscode = tmp_path / "kernel-v2-1234abcd.json"
    vscode.write_text("{}")
    assert "no running Jupyter server" in ss.find_server(connection_file=str(vscode), runtime_dir=str(tmp_path)).reason
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    connection = _runtime(tmp_path, url, dead.pid)  # a server that has exited left its file behind
    assert "no running Jupyter server" in ss.find_server(connection_file=connection, runtime_dir=str(tmp_path)).reason
    sock = _runtime(tmp_path, "http+unix://x", os.getpid(), sock="/tmp/s.sock")
    assert not ss.find_server(connection_file=sock, parent_pid=os.getpid(), runtime_dir=str(tmp_path))


def test_requests_never_go_through_a_proxy(tmp_path, stand_in, monkeypatch):
    url, _seen = stand_in
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a proxy that would get the token
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    link = ss.ServerLink(url, TOKEN, None, KERNEL_ID, "parent process")
    assert ss.get_json(link, "gpunb/api/gpus", 2.0)["gpus"] == []
    with pytest.raises(ss.ServerError, match="does not run gpunb's server extension"):
        ss.get_json(link, "gpunb/api/nothing", 2.0)
    with pytest.raises(ss.ServerError, match="refused"):
        ss.get_json(ss.ServerLink(url, "bad", None, KERNEL_ID, ""), "gpunb/api/gpus", 2.0)
    with pytest.raises(ss.ServerError, match="nothing listens on port 9"):  # checked before the request
        ss.get_json(ss.ServerLink("http://127.0.0.1:9/", TOKEN, None, KERNEL_ID, ""), "gpunb/api/gpus", 0.5)


def test_latest_never_waits_and_failures_are_not_retried_on_every_redraw():
    link = ss.ServerLink("http://127.0.0.1:1/", TOKEN, None, KERNEL_ID, "parent process")
    calls = {"find": 0, "fetch": 0}
    release = threading.Event()

    def find():
        calls["find"] += 1
        return link

    def slow_fetch(link, path, timeout):
        calls["fetch"] += 1
        release.wait(5)
        return {"gpus": [], "t_unix": 1.0}

    sessions = ss.ServerSessions(find=find, fetch=slow_fetch)
    t0 = time.monotonic()
    first = sessions.latest()
    assert time.monotonic() - t0 < 0.1 and not first and first.reason == "not asked yet"
    sessions.latest()  # a second redraw while the first request runs starts no second one
    release.set()
    assert sessions.get().data == {"gpus": [], "t_unix": 1.0}
    assert calls == {"find": 1, "fetch": 1}
    assert sessions.latest().data is not None
    sessions.close()

    def failing(link, path, timeout):
        calls["fetch"] += 1
        raise ss.ServerError("the Jupyter server did not answer")

    calls.update(find=0, fetch=0)
    broken = ss.ServerSessions(find=find, fetch=failing)
    assert broken.get().reason == "the Jupyter server did not answer"
    for _ in range(5):
        assert not broken.get() and not broken.latest()
    assert calls == {"find": 1, "fetch": 1}  # asked again only after RETRY_AFTER_S
    broken.close()
