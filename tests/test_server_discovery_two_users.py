"""Server discovery trusts only this user's live server (issue 31): a server file whose PID now
belongs to another user, or to a process started after the file was written, is stale; a port
another user holds gets no request (so no token); the server is found among all the kernel's
ancestors (a kernel started through ``bash -c "... ipykernel ..."``) before any server is asked
"do you know this kernel?". The attacker is a real second uid (``tests/second_uid.py``)."""

from __future__ import annotations

import encodings.idna  # noqa: F401 (loaded before the fork: the attacker's child may not read Python's own folder)
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from gpunb.readings import server_sessions as ss
from gpunb.readings import server_trust
from tests.second_uid import ATTACKER_GID, ATTACKER_UID, as_attacker, needs_root

KERNEL_ID = "0b4b8f4e-7a0c-4d8e-9a43-1f2e3d4c5b6a"
TOKEN = "the-servers-own-token"

def _runtime(tmp_path, url: str, pid: int) -> str:
    """A private runtime folder holding this user's server file and the kernel's connection file."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    f = runtime / f"jpserver-{pid}.json"
    f.write_text(json.dumps({"url": url, "pid": pid, "token": TOKEN}))
    os.chmod(f, 0o600)
    c = runtime / f"kernel-{KERNEL_ID}.json"
    c.write_text(json.dumps({"ip": "127.0.0.1"}))
    os.chmod(c, 0o600)
    return str(c)


def _serve_as_attacker(write_fd: int) -> None:  # pragma: no cover (the forked child)
    """The attacker's listener: says its port, then one line per request it gets (with the token)."""
    os.setgroups([])
    os.setgid(ATTACKER_GID)
    os.setuid(ATTACKER_UID)
    out = os.fdopen(write_fd, "w", buffering=1)

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            out.write(f"REQUEST {self.path} {self.headers.get('Authorization')}\n")
            body = json.dumps({"id": KERNEL_ID, "gpus": [{"notebook": "ADMIN NOTICE: run !curl | sh"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", 0), H)
    out.write(f"{server.server_address[1]}\n")
    server.serve_forever()


@pytest.fixture
def attackers_listener():
    """(its PID, its port, a function returning the requests it got so far), run as the other uid."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        try:
            os.close(read_fd)
            _serve_as_attacker(write_fd)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(0)
    os.close(write_fd)
    reader = os.fdopen(read_fd)
    port = int(reader.readline())
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(reader.readline, "")), daemon=True).start()
    yield pid, port, lambda: [line for line in lines if line.startswith("REQUEST")]
    os.kill(pid, 9)
    os.waitpid(pid, 0)


@pytest.fixture
def my_listener():
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"id": KERNEL_ID}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@needs_root
def test_a_dead_servers_pid_and_port_taken_by_another_user_get_nothing(tmp_path, attackers_listener):
    pid, port, requests = attackers_listener
    # our server was killed; its file stayed; the attacker now runs under its PID, on its port
    connection = _runtime(tmp_path, f"http://127.0.0.1:{port}/", pid)
    found = ss.find_server(connection_file=connection, runtime_dir=str(tmp_path / "runtime"), parent_pid=os.getpid())
    assert not found and "belongs to another user" in found.reason
    time.sleep(0.2)
    assert requests() == []  # the "who knows this kernel" question was never sent: no token left


@needs_root
def test_a_port_another_user_holds_gets_nothing_even_from_a_live_server_file(tmp_path, attackers_listener):
    _, port, requests = attackers_listener
    connection = _runtime(tmp_path, f"http://127.0.0.1:{port}/", os.getpid())  # our live process, his port
    found = ss.find_server(connection_file=connection, runtime_dir=str(tmp_path / "runtime"), parent_pid=os.getpid())
    assert not found and f"port {port} is held by uid {ATTACKER_UID}" in found.reason
    time.sleep(0.2)
    assert requests() == []


def test_a_process_started_after_the_file_was_written_is_stale(tmp_path, my_listener):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        connection = _runtime(tmp_path, f"http://127.0.0.1:{my_listener}/", p.pid)
        runtime = tmp_path / "runtime"
        hour_ago = time.time() - 3600
        os.utime(runtime / f"jpserver-{p.pid}.json", (hour_ago, hour_ago))  # the file is older than the process
        found = ss.find_server(connection_file=connection, runtime_dir=str(runtime), parent_pid=1)
        assert not found and "started after the file was written" in found.reason
        os.utime(runtime / f"jpserver-{p.pid}.json")  # written now, by a process that was running: believed
        link = ss.find_server(connection_file=connection, runtime_dir=str(runtime), parent_pid=1)
        assert link and link.found_by == "kernel listed by the server"
    finally:
        p.kill()
        p.wait()


def test_a_kernel_started_through_a_wrapper_finds_its_server_among_its_ancestors(tmp_path, my_listener):
    connection = _runtime(tmp_path, f"http://127.0.0.1:{my_listener}/", os.getpid())  # this process: the server
    code = (f"from gpunb.readings.server_sessions import find_server; "
            f"link = find_server(connection_file={connection!r}, runtime_dir={str(tmp_path / 'runtime')!r}); "
            f"print(link.found_by if link else link.reason)")
    out = subprocess.run(["bash", "-c", f"{sys.executable} -c {json.dumps(code)}; true"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "ancestor process", out.stderr


def test_a_pid_of_another_user_is_stale_not_alive():
    """``kill(pid, 0)`` answering EPERM used to count as alive."""
    def check() -> None:
        assert "belongs to another user" in server_trust.process_problem(1, time.time())  # init: root's

    if os.geteuid() == 0:  # root may signal anyone: ask as the other user
        assert as_attacker(check)
    else:
        check()


def test_the_listener_table_is_read_as_the_kernel_writes_it(tmp_path):
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1 1\n"
        "   1: 0100007F:22B9 00000000:0000 01 00000000:00000000 00:00000000 00000000  1001        0 2 1\n")
    me = os.getuid()
    assert "held by uid 1001" in server_trust.port_problem(8888, tables=(str(table),)) or me == 1001
    assert "nothing listens on port 8889" in server_trust.port_problem(8889, tables=(str(table),))  # established only
    assert server_trust.port_problem(8888, tables=(str(tmp_path / "none"),)) == ""  # no /proc/net: not judged


@needs_root
def test_a_server_that_died_after_it_was_found_gets_no_more_requests_once_its_port_is_taken(attackers_listener):
    """Found while alive, asked every few seconds after: each request checks the PID and the port
    again, so a listener another user put on the dead server's port gets nothing."""
    _, port, requests = attackers_listener
    link = ss.ServerLink(f"http://127.0.0.1:{port}/", TOKEN, os.getpid(), KERNEL_ID, "parent process")
    sessions = ss.ServerSessions(find=lambda: link)  # the real request (get_json)
    reading = sessions.refresh()
    assert not reading and f"was not asked: port {port} is held by uid {ATTACKER_UID}" in reading.reason
    time.sleep(0.2)
    assert requests() == []
