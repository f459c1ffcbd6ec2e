"""Issue 21's attack review, one test per finding: a second local user (another uid) plants
files where gpunb looks, and gets nothing, writes nothing, and never sees a token.

Run as root (CI containers), the "other user" is a real uid: files are ``chown``-ed to
``nobody``'s uid. Otherwise ownership is simulated by telling gpunb that this user has another
uid (``untrusted_file.my_uid``), which makes every file look like someone else's."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from gpunb.readings import server_sessions as ss
from gpunb.readings import untrusted_file

KERNEL_ID = "0b4b8f4e-7a0c-4d8e-9a43-1f2e3d4c5b6a"
TOKEN = "server-token"
HUB_TOKEN = "hub-token-never-to-be-sent"
OTHER_UID = 65534  # nobody


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def listener():
    """A listener that records every request and its Authorization header; ``redirect_to`` makes
    it answer 307 to another URL."""
    seen: list[tuple[str, str | None]] = []
    state: dict[str, str] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if state.get("redirect_to"):
                self.send_response(307)
                self.send_header("Location", state["redirect_to"] + self.path.lstrip("/"))
                self.end_headers()
                return
            data = json.dumps({"id": KERNEL_ID, "gpus": [], "kernels": [], "notes": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    servers = []

    def start():
        server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start, seen, state
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def other_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def give_away(path, monkeypatch) -> None:
    """Make ``path`` another user's: really (root), or as gpunb sees it (this user "has" another uid)."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        monkeypatch.setattr(untrusted_file, "my_uid", lambda: os.getuid() + 1)


def plant(directory, url: str, pid: int, token: str | None = None, **extra):
    f = directory / f"jpserver-{pid}.json"
    f.write_text(json.dumps({"url": url, "pid": pid, **({"token": token} if token is not None else {}), **extra}))
    os.chmod(f, 0o600)
    return f


def connection(directory):
    c = directory / f"kernel-{KERNEL_ID}.json"
    c.write_text(json.dumps({"ip": "127.0.0.1"}))
    os.chmod(c, 0o600)
    return str(c)


def test_a_server_file_in_a_shared_runtime_directory_gets_no_token(tmp_path, listener, other_process,
                                                                   monkeypatch):
    start, seen, _ = listener
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
    shared = tmp_path / "runtime"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # a hub's runtime directory on shared storage
    plant(shared, start(), other_process)  # another user's listener, no token: the hub token would go there
    plant(shared, start(), os.getpid(), token="x")  # even one that claims to be our parent
    found = ss.find_server(connection_file=connection(shared), runtime_dir=str(shared), parent_pid=os.getpid())
    assert not found and "writable by other users" in found.reason
    assert seen == []  # nothing was sent anywhere


def test_another_users_server_file_is_not_believed(tmp_path, listener, monkeypatch):
    start, seen, _ = listener
    planted = plant(tmp_path, start(), os.getpid(), token=TOKEN)
    give_away(planted, monkeypatch)
    found = ss.find_server(connection_file=str(tmp_path / f"kernel-{KERNEL_ID}.json"), runtime_dir=str(tmp_path),
                           parent_pid=os.getpid())
    assert not found and "belongs to uid" in found.reason and seen == []


def test_the_hub_token_never_goes_to_a_server_file_without_a_token(tmp_path, listener, other_process,
                                                                   monkeypatch):
    start, seen, _ = listener
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
    plant(tmp_path, start(), os.getpid())  # our own parent, a hub single-user server: no token in its file
    plant(tmp_path, start(), other_process)  # not our parent: the "who knows this kernel" fallback
    link = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=os.getpid())
    assert link and link.token == ""
    with pytest.raises(ss.ServerError):
        ss.get_json(ss.ServerLink("http://127.0.0.1:9/", link.token, None, KERNEL_ID, ""), "gpunb/api/gpus", 0.3)
    ss.get_json(link, "gpunb/api/gpus", 2.0)
    found = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=1)
    assert not found  # no token: the fallback asks nobody
    assert all(auth is None for _, auth in seen) and len(seen) == 1


def test_only_loopback_or_the_kernels_own_host(tmp_path, listener):
    start, seen, _ = listener
    url = start()
    plant(tmp_path, "http://198.51.100.7:8888/", os.getpid(), token=TOKEN)
    found = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=os.getpid())
    assert not found and "neither loopback" in found.reason
    port = url.rsplit(":", 1)[1]
    plant(tmp_path, f"http://0.0.0.0:{port}", os.getpid(), token=TOKEN)  # --ip=0.0.0.0: reached on loopback
    link = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=os.getpid())
    assert link and link.url == f"http://127.0.0.1:{port}" and seen == []
    c = tmp_path / f"kernel-{KERNEL_ID}.json"
    c.write_text(json.dumps({"ip": "198.51.100.7"}))  # a kernel that listens on that host itself
    plant(tmp_path, f"http://198.51.100.7:{port}/", os.getpid(), token=TOKEN)  # (a port this user holds)
    assert ss.find_server(connection_file=str(c), runtime_dir=str(tmp_path), parent_pid=os.getpid())


def test_authorization_is_never_forwarded_on_a_redirect(listener):
    start, seen, state = listener
    elsewhere = start()
    server = start()
    state["redirect_to"] = elsewhere
    link = ss.ServerLink(server, TOKEN, None, KERNEL_ID, "parent process")
    with pytest.raises(ss.ServerError, match="redirect"):
        ss.get_json(link, "gpunb/api/gpus", 2.0)
    assert seen == [("/gpunb/api/gpus", f"token {TOKEN}")]  # the first server only, never the second


@pytest.mark.parametrize("content", [
    "[1, 2, 3]",  # a JSON list
    json.dumps({"url": "http://127.0.0.1:1/", "pid": 2**70, "token": "x"}),
    json.dumps({"url": ["x"], "pid": 1, "token": "x"}),
    json.dumps({"url": "http://127.0.0.1:1/", "pid": True, "token": "x"}),
    json.dumps({"url": "http://127.0.0.1:1/", "pid": 1, "token": 5}),
    "{not json",
])
def test_a_malformed_server_file_is_ignored_with_a_note(tmp_path, content):
    (tmp_path / "jpserver-1.json").write_text(content)
    found = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=1)
    assert not found and "ignored" in found.reason


def test_a_fifo_server_file_does_not_hang_discovery(tmp_path):
    os.mkfifo(tmp_path / "jpserver-1.json")
    done = threading.Event()
    out = {}

    def find():
        out["found"] = ss.find_server(connection_file=connection(tmp_path), runtime_dir=str(tmp_path), parent_pid=1)
        done.set()

    threading.Thread(target=find, daemon=True).start()
    assert done.wait(3.0) and "not a regular file" in out["found"].reason


def test_a_discovery_that_raises_becomes_a_reason_not_a_thread_traceback():
    def broken():
        raise OverflowError("Python int too large to convert to C int")

    sessions = ss.ServerSessions(find=broken)
    reading = sessions.refresh()
    assert not reading and "could not be looked up (OverflowError" in reading.reason
    sessions.close()


# -- the rank channel ---------------------------------------------------------------------------

def _victim(tmp_path):
    v = tmp_path / "victim-private.json"
    v.write_text("the victim's own data")
    os.chmod(v, 0o600)
    return v


def test_a_worker_that_outlives_the_cell_writes_nothing_into_a_directory_recreated_by_another_user(tmp_path):
    from gpunb.analysis.ranks.channel_dir import ChannelWriter, identity

    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o1777)
    channel = parent / "gpunb-ranks-abc"
    channel.mkdir(mode=0o700)
    ident = identity(os.stat(channel))
    writer = ChannelWriter(str(channel), ident)
    assert writer.write("rank-1.json", "{}") and os.listdir(channel) == ["rank-1.json"]
    victim = _victim(tmp_path)
    os.unlink(channel / "rank-1.json")
    os.rmdir(channel)  # the cell ended
    channel.mkdir(mode=0o777)  # the other user recreates the name it saw in `ls /tmp`...
    os.chmod(channel, 0o777)
    if os.geteuid() == 0:
        os.chown(channel, OTHER_UID, OTHER_UID)
    for tid in (threading.get_ident(),):  # ...and plants symlinks where the writer would write
        (channel / f".rank-1.json.{os.getpid()}.{tid}.tmp").symlink_to(victim)
    (channel / "rank-1.json").symlink_to(victim)
    planted = sorted(os.listdir(channel))
    assert not writer.write("rank-1.json", '{"host": "secret"}')
    assert not writer.open  # closed for good
    assert victim.read_text() == "the victim's own data" and sorted(os.listdir(channel)) == planted
    assert not ChannelWriter(str(channel), ident).open  # a fresh start from the old environment: refused
    assert not ChannelWriter(str(channel), identity(os.stat(channel))).open  # even with its identity


def test_a_symlink_planted_at_a_records_temporary_name_is_never_followed(tmp_path):
    from gpunb.analysis.ranks.channel_dir import ChannelWriter, identity

    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    planted = f".rank-1.json.{os.getpid()}.{threading.get_ident()}.tmp"  # the name the writer once used
    (channel / planted).symlink_to(victim)
    writer = ChannelWriter(str(channel), identity(os.stat(channel)))
    assert writer.write("rank-1.json", '{"pid": 1}')
    assert victim.read_text() == "the victim's own data"
    assert sorted(os.listdir(channel)) == sorted([planted, "rank-1.json"])
    assert (channel / "rank-1.json").read_text() == '{"pid": 1}'
    assert oct(os.stat(channel / "rank-1.json").st_mode & 0o777) == "0o600"


def test_a_channel_made_group_writable_or_given_away_is_no_longer_written(tmp_path, monkeypatch):
    from gpunb.analysis.ranks import channel_dir
    from gpunb.analysis.ranks.channel_dir import ChannelWriter, identity

    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    writer = ChannelWriter(str(channel), identity(os.stat(channel)))
    os.chmod(channel, 0o770)
    assert not writer.write("rank-1.json", "{}")
    channel2 = tmp_path / "channel2"
    channel2.mkdir(mode=0o700)
    writer = ChannelWriter(str(channel2), identity(os.stat(channel2)))
    monkeypatch.setattr(channel_dir.os, "getuid", lambda: os.geteuid() + 1)
    assert not writer.write("rank-1.json", "{}")
    assert os.listdir(channel) == os.listdir(channel2) == []


def test_a_fresh_worker_started_after_the_cell_writes_nowhere(tmp_path):
    """A process that outlived the cell starts a Python child later: it inherits the channel's
    environment, and the other user has recreated the directory by then."""
    from gpunb.analysis.ranks.channel import BOOT_DIR, RankChannel

    env: dict[str, str] = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    ch = RankChannel(env).open()
    kept = dict(env)  # what a surviving child keeps
    path = ch.path
    ch.close()
    os.mkdir(path, 0o777)
    os.chmod(path, 0o777)
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    code = ("import torch\nm = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for _ in range(15):\n    m(torch.randn(3, 2)).sum().backward(); o.step()\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **kept}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert kept["PYTHONPATH"].startswith(BOOT_DIR) and os.listdir(path) == []
    os.rmdir(path)


def _record(**kw):
    base = {"version": 1, "pid": 4242, "rank": 0, "world_size": 1, "launcher": "fork", "device": None, "gpu": {},
            "steps": 3, "step_ms": [1.0, 2.0, 3.0], "step_ms_offset": 0, "source": "host clock",
            "first_step_ms": 1.0, "batches": 0, "data_wait_s": 0.0, "batch_size": None, "first_batch_s": None,
            "last_step_s": 0.1, "wall_s": 0.2, "started_unix": 1.0, "peak_allocated_bytes": None,
            "peak_reserved_bytes": None, "nvml_peak_bytes": None, "ddp": None, "final": True, "group": None}
    base.update(kw)
    return base


@pytest.mark.parametrize("bad", [
    {"started_unix": "yesterday"}, {"step_ms": ["1", 2]}, {"step_ms": "fast"}, {"pid": "x"}, {"steps": 2.5},
    {"gpu": ["H200"]}, {"gpu": {"nvml_index": "0"}}, {"ddp": {"iteration": "x"}}, {"ddp": {"forward_ms": "x"}},
    {"rank": True}, {"launcher": 3}, {"first_batch_s": float("nan")}, {"group": "yes"}, {"last_step_s": [1]},
])
def test_a_malformed_rank_record_is_left_out_with_a_note_and_the_rest_reported(tmp_path, bad):
    from gpunb.analysis.ranks.channel import read_records
    from gpunb.analysis.ranks.summary import build_ranks

    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    (channel / "rank-1.json").write_text(json.dumps(_record(pid=1)))
    (channel / "rank-2.json").write_text(json.dumps(_record(**{"pid": 2, **bad})))
    records, notes = read_records(str(channel))
    assert [r["pid"] for r in records] == [1] and "rank-2.json" in notes[0]
    assert build_ranks(records, notes=notes).notes[0] == notes[0]


def test_two_records_with_a_non_numeric_start_cost_the_cell_nothing(tmp_path):
    from gpunb.analysis.ranks.channel import read_records

    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    for pid in (1, 2):
        (channel / f"rank-{pid}.json").write_text(json.dumps(_record(pid=pid, started_unix="soon")))
    records, notes = read_records(str(channel))
    assert records == [] and "2 worker record(s) left out" in notes[0]


def test_a_fifo_or_another_users_file_named_like_a_record_is_skipped_at_once(tmp_path, monkeypatch):
    from gpunb.analysis.ranks.channel import read_records

    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    os.mkfifo(channel / "rank-1.json")
    (channel / "rank-2.json").write_text(json.dumps(_record(pid=2)))
    (channel / "rank-3.json").write_text(json.dumps(_record(pid=3)))
    if os.geteuid() == 0:
        os.chown(channel / "rank-3.json", OTHER_UID, OTHER_UID)
    done = threading.Event()
    out = {}

    def read():
        out["r"] = read_records(str(channel))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(3.0)
    records, notes = out["r"]
    expected = [2] if os.geteuid() == 0 else [2, 3]
    assert [r["pid"] for r in records] == expected and "rank-1.json (is not a regular file" in notes[0]


# -- --ops traces ------------------------------------------------------------------------------

class TorchLikeSave:
    """What torch's ``export_chrome_trace`` does with a path: writes ``<path>.tmp`` with a plain
    open (following symlinks), renames it, and refuses a second save."""

    def __init__(self):
        self.saved = 0

    def __call__(self, path: str) -> None:
        if self.saved:
            raise RuntimeError("Trace is already saved")
        self.saved += 1
        with open(path + ".tmp", "w") as f:
            f.write('{"traceEvents": []}')
        os.replace(path + ".tmp", path)


def test_a_trace_next_to_the_notebook_is_written_through_a_private_directory(tmp_path):
    from gpunb.analysis.steps.trace_file import write_trace

    victim = _victim(tmp_path)
    notebook = tmp_path / "notebooks"
    notebook.mkdir(mode=0o777)
    os.chmod(notebook, 0o1777)  # a shared course directory
    wanted = notebook / "gpuprofile-cell3-20261201-101010.pt.trace.json"
    (notebook / (wanted.name + ".tmp")).symlink_to(victim)  # planted where torch writes first
    path, size, note = write_trace(TorchLikeSave(), wanted)
    assert (path, note) == (str(wanted), "") and size == len('{"traceEvents": []}')
    assert victim.read_text() == "the victim's own data"
    assert oct(os.stat(wanted).st_mode & 0o777) == "0o600"  # others can list this directory
    assert sorted(os.listdir(notebook)) == sorted([wanted.name, wanted.name + ".tmp"])  # no staging left


def test_a_notebook_directory_that_cannot_take_it_falls_back_to_a_private_temp_directory(tmp_path, monkeypatch):
    import tempfile

    from gpunb.analysis.steps import trace_file

    (tmp_path / "tmp").mkdir()
    (tmp_path / "a-file").write_text("not a folder")  # the notebook's folder cannot be made (root writes anywhere)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    save = TorchLikeSave()
    path, size, note = trace_file.write_trace(save, tmp_path / "a-file" / "nb" / "t.pt.trace.json")
    assert save.saved == 1 and path and size
    assert os.path.dirname(path).startswith(str(tmp_path / "tmp" / "gpunb-trace-"))
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert "private temp directory" in note and "Not a directory" in note and "a-file/nb" in note


def test_a_trace_that_torch_could_not_write_reports_the_real_error_and_no_path(tmp_path):
    from gpunb.analysis.steps.trace_file import write_trace

    def full_disk(path):
        raise RuntimeError("No space left on device")

    path, size, note = write_trace(full_disk, tmp_path / "t.pt.trace.json")
    assert (path, size) == ("", None) and "No space left on device" in note and os.listdir(tmp_path) == []

    def symlink_instead(path):
        os.symlink(str(tmp_path / "elsewhere"), path)

    path, size, note = write_trace(symlink_instead, tmp_path / "t.pt.trace.json")
    assert path == "" and "not a regular file" in note and os.listdir(tmp_path) == []


# -- what the server shows of other processes and paths -----------------------------------------

@pytest.mark.parametrize("cmdline,shown", [
    (["python", "-W", "ignore:SECRET", "train.py"], "train.py"),
    (["python3", "-uW", "ignore:SECRET", "train.py"], "train.py"),
    (["python", "-X", "SECRET", "train.py"], "train.py"),
    (["python", "--check-hash-based-pycs", "SECRET", "train.py"], "train.py"),
    (["python", "-W", "SECRET"], ""),
    (["python", "-u", "-m", "torch.distributed.run", "--token", "SECRET"], "-m torch.distributed.run"),
    (["python", "-c", "SECRET"], "-c"),
    (["python", "-RW", "SECRET", "train.py"], "train.py"),  # issue 31: combined short flags
    (["python", "-xW", "SECRET", "train.py"], "train.py"),
    (["python", "-uxRX", "SECRET", "train.py"], "train.py"),
    (["python", "-Z", "SECRET", "train.py"], ""),  # a letter gpunb does not know: no script named
])
def test_the_script_shown_for_a_process_never_carries_an_options_value(cmdline, shown):
    from gpunb.readings.process_facts import _script

    assert _script(cmdline) == shown


_FLAGS = "bBdEhiIOPqRsSuvVx"


@settings(max_examples=300, deadline=None)
@given(groups=hst.lists(hst.tuples(hst.text(_FLAGS, max_size=3), hst.sampled_from(["W", "X", ""]),
                                   hst.booleans()), max_size=4),
       tail=hst.sampled_from([["train.py"], ["-m", "pkg.mod"], []]))
def test_no_combination_of_short_flags_shows_an_options_value(groups, tail):
    """The class behind ``-RW SECRET``: flags combined in one argument, a value option among them
    (its value glued on or in the next argument), in any order; the secret never shows."""
    from gpunb.readings.process_facts import _script

    args = []
    for flags, value_option, glued in groups:
        if value_option and glued:
            args.append(f"-{flags}{value_option}SECRET")
        elif value_option:
            args += [f"-{flags}{value_option}", "SECRET"]
        elif flags:
            args.append(f"-{flags}")
    shown = _script(["python", *args, *tail])
    assert "SECRET" not in shown
    assert shown == {"train.py": "train.py", "-m": "-m pkg.mod"}.get(tail[0] if tail else "", "")


def test_control_characters_in_a_notebook_path_never_reach_the_metrics_text():
    pytest.importorskip("prometheus_client")
    from gpunb.analysis.holders.gpus import HoldersReport, KernelUse
    from gpunb.readings.server_kernels import KernelInfo, SessionInfo
    from gpunb.views.metrics_view import metrics_text

    path = 'a\r\ngpunb_forged{x="1"} 1\x1b[2J\x00.ipynb'
    kernel = KernelInfo(KERNEL_ID, "python3\r", 1234, "idle", 1.0, 1, (SessionInfo(path, "n", "notebook"),))
    body, _ = metrics_text(HoldersReport(1.0, True, kernels=(KernelUse(kernel, {}, (), True),)))
    text = body.decode()
    assert not any(line.startswith("gpunb_forged") for line in text.splitlines())
    assert "\r" not in text and "\x1b" not in text and "\x00" not in text
    assert 'path="a\ufffd\ufffdgpunb_forged{x=\\"1\\"} 1\ufffd[2J\ufffd.ipynb"' in text


def test_an_answer_cut_short_is_a_reason_not_a_thread_traceback():
    import http.client

    link = ss.ServerLink("http://127.0.0.1:1/", TOKEN, None, KERNEL_ID, "parent process")

    def cut_short(link, path, timeout):
        raise http.client.IncompleteRead(b"{", 100)

    sessions = ss.ServerSessions(find=lambda: link, fetch=cut_short)
    reading = sessions.refresh()
    assert not reading and "broken answer (IncompleteRead" in reading.reason
    sessions.close()
