"""%%gpumem --trace, gpunb.trace_memory() and the OOM doctor's stacks, on CPU, from a real H200 recording.

The snapshots in tests/data/alloc_history/ were recorded on one H200 (see its README.md and
tests/simulated_alloc_history.py); tests/gpu/test_memtrace_gpu.py checks the same on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")

from gpunb.analysis.memory.alloc_sites import site_of, user_frames  # noqa: E402
from gpunb.analysis.memory.alloc_timeline import block_bytes, replay  # noqa: E402
from gpunb.analysis.memory.alloc_trace import TraceSession, oom_sites  # noqa: E402
from gpunb.readings.alloc_history import save_snapshot, unavailable  # noqa: E402
from tests.simulated_alloc_history import (  # noqa: E402
    RECORDING,
    cache_cell_sources,
    oom_snapshot,
    recorded_torch,
    train_snapshot,
)

MiB, GiB = 2**20, 2**30
# Adam's two moments of the recorded MLP (fc1 1024->8192, fc2 8192->1024, fp32): twice its parameters.
PARAM_BYTES = (1024 * 8192 + 8192 + 8192 * 1024 + 1024) * 4


@pytest.fixture
def cells():
    return cache_cell_sources()


def _replay(cells, **kw):
    return replay(train_snapshot(), device=0, baseline_bytes=RECORDING["base_allocated_before_train"],
                  start_roles=kw.pop("start_roles", {}), end_roles=kw.pop("end_roles", {}), cell_numbers=cells, **kw)


def test_the_timelines_peak_is_torchs_max_memory_allocated(cells):
    r = _replay(cells)
    assert r.peak_bytes == RECORDING["max_memory_allocated_train"]  # 1158792192 bytes on the H200
    assert r.events == 98 + 82 + 82 - 82  # allocs, and one free per block (its completion is not a second free)
    assert r.time_unit == "ms" and 0 < r.peak_t < r.points[-1].t


def test_events_count_whole_512_byte_blocks_as_torchs_counter_does():
    assert [block_bytes(n) for n in (0, 4, 512, 513, 2**20)] == [0, 512, 512, 1024, 2**20]


def test_the_lines_at_the_peak_are_the_users_own(cells):
    sites = _replay(cells).sites_at_peak
    labels = [s.label for s in sites]
    # autograd's thread has no Python stack: its blocks are charged to the line that called backward
    assert labels[0] == "the backward pass of In [3] line 7: loss.backward()"
    wide = next(s for s in sites if "wide = torch.randn(8192, 8192" in s.label)
    assert wide.label.startswith("In [3] line 3: ") and wide.nbytes == 256 * MiB and wide.blocks == 1
    assert "In [3] line 8: opt.step()" in labels
    # torch's, IPython's and the driving script's frames are folded away
    for s in sites:
        for frame in s.stack:
            assert "interactiveshell" not in frame and "record_alloc_history" not in frame and "torch/" not in frame
    before = next(s for s in sites if s.label == "allocated before this cell")
    assert before.nbytes == RECORDING["base_allocated_before_train"]
    assert sum(s.nbytes for s in sites) == RECORDING["max_memory_allocated_train"]


def test_roles_at_the_peak(cells):
    r = _replay(cells)
    assert r.peak_by_role["optimizer state"] == 2 * PARAM_BYTES  # Adam's exp_avg and exp_avg_sq
    assert r.peak_by_role["activations"] >= 256 * MiB  # made in forward, alive into backward
    assert sum(r.peak_by_role.values()) == r.peak_bytes
    # blocks from before the cell take the census role their address had (here: the parameters)
    snap = train_snapshot()
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    live_before = [b for seg in snap["segments"] for b in seg["blocks"]
                   if b["state"] == "active_allocated" and b["address"] not in made and b["size"] == 32 * MiB]
    named = _replay(cells, start_roles={b["address"]: "parameter" for b in live_before})
    assert named.peak_by_role["parameters"] == sum(b["size"] for b in live_before) > 0
    assert named.peak_by_role["other"] == r.peak_by_role["other"] - named.peak_by_role["parameters"]


def test_a_user_module_file_is_kept_and_library_frames_fold(cells):
    frames = [{"filename": "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", "line": 134,
               "name": "forward"},
              {"filename": "/home/ann/project/mymodel.py", "line": 12, "name": "forward"},
              {"filename": "/tmp/site/IPython/core/magics/execution.py", "line": 1300, "name": "time"},
              {"filename": "<ipython-input-3-5119479f56ea>", "line": 4, "name": "<module>"},
              {"filename": "/tmp/site/IPython/core/interactiveshell.py", "line": 3823, "name": "run_code"}]
    mine = user_frames(frames, cells)
    assert [f.where for f in mine] == ["mymodel.py line 12", "In [3] line 4"]
    label, stack = site_of(frames, cells)
    assert label.startswith("mymodel.py line 12") and stack[0] == "In [3] line 4: h = model.fc1(x)"
    assert site_of([frames[0]], cells)[0].startswith("no line of yours: torch/nn/modules/linear.py")


def test_oom_sites_name_the_failed_line_and_the_largest_live_one(cells):
    sites = oom_sites(oom_snapshot(), device=0, cell_numbers=cells)
    assert sites.failed_at == 'In [6] line 2: too_big = torch.empty(10 * 2**30, dtype=torch.uint8, device="cuda")'
    assert sites.requested_bytes == 10 * GiB
    assert sites.live[0].label.startswith("In [5] line 5: keep = torch.empty(12 * 2**30")
    assert sites.live[0].nbytes == 12 * GiB


def test_session_restores_the_history_and_checks_the_peak(cells):
    sim = recorded_torch()
    session = TraceSession(torch=sim, namespace={}, cell_numbers=lambda: cells)
    session.start()
    assert sim.cuda.enabled and sim.cuda.history_calls[0]["stacks"] == "python"
    trace = session.stop()
    assert not sim.cuda.enabled and sim.cuda.history_calls[-1] == {"enabled": None}
    assert "reset_peak_memory_stats" in sim.cuda.calls
    assert trace.peak_bytes == trace.torch_peak_bytes and not trace.notes, trace.notes
    # a recording of the user's own is read and left on
    own = recorded_torch(enabled=True)
    session = TraceSession(torch=own, namespace={}, cell_numbers=lambda: cells)
    session.start()
    trace = session.stop()
    assert own.cuda.enabled and own.cuda.history_calls == []
    assert any("already on" in n for n in trace.notes)


def test_view_finding_first_chart_with_peak_details_one_click_away(cells):
    sim = recorded_torch()
    session = TraceSession(torch=sim, namespace={}, cell_numbers=lambda: cells, label="In [3]")
    session.start()
    trace = session.stop()
    text = str(trace)
    first = text.splitlines()[0]
    assert first.startswith("gpunb memory trace of In [3]: peak 1.08 GiB; the largest share")
    assert "loss.backward()" in first
    assert "At the peak" in text and "optimizer state 128.1 MiB" in text and "Details:" in text
    assert "start 96.0 MiB" in text  # the timeline starts from what was allocated before the cell
    html = trace._repr_mimebundle_()["text/html"]
    assert html.index("peak 1.08 GiB") < html.index("<img") < html.index("<details")
    assert 'src="data:image/svg+xml;base64,' in html and "<svg" not in html  # survives untrusted notebooks
    import base64

    svg = base64.b64decode(re.search(r'base64,([^"]+)"', html).group(1)).decode()
    assert "stroke-dasharray" in svg and "#e0413a" in svg and svg.count("<polygon") >= 4  # the peak, the roles
    # x is the order of events: on the clock steps 2 and 3 fill the last 4 of 394 ms and the
    # peak would sit on the right edge, a few pixels wide; its level is marked with a dot
    dot = re.search(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)
    assert dot and 0.5 * 520 < float(dot.group(1)) < 0.95 * 520 and float(dot.group(2)) < 120 / 2
    assert "allocations and frees, in order" in html and "peak 1.08 GiB</span>" in html
    assert "the backward pass of In [3] line 7" in html and "&lt;" not in first


def test_unavailable_says_why_in_one_line():
    assert "CPU-only build" in unavailable(torch) or "no CUDA GPU" in unavailable(torch)
    assert "not imported" in unavailable(None)
    old = type("T", (), {"__version__": "2.0.1", "cuda": type("C", (), {"memory": object()})()})()
    assert "upgrade torch" in unavailable(old)


def test_save_writes_a_new_private_file_only(tmp_path):
    snap = train_snapshot()
    path = tmp_path / "cell.pickle"
    size = save_snapshot(snap, path)
    assert size == path.stat().st_size > 0 and (path.stat().st_mode & 0o077) == 0
    assert pickle.loads(path.read_bytes())["device_traces"][0] == snap["device_traces"][0]
    with pytest.raises(ValueError, match="already exists"):
        save_snapshot(snap, path)
    os.symlink(tmp_path / "elsewhere", tmp_path / "link.pickle")
    with pytest.raises(ValueError):
        save_snapshot(snap, tmp_path / "link.pickle")
    assert not (tmp_path / "elsewhere").exists()


# -- the magics, in an in-process IPython shell ---------------------------------------------------

@pytest.fixture
def ip(ip):
    ip.reset(new_session=False)
    return ip


def test_traced_cell_without_cuda_runs_and_says_why(ip, capsys):
    ip.run_cell("import torch")
    r = ip.run_cell("%%gpumem --trace -o t\nx = torch.ones(3)\nx.sum().item()")
    assert r.success and r.result == 3.0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("gpunb: no memory trace: ")
    from gpunb.analysis.memory.alloc_trace import _machine_without_cuda
    assert _machine_without_cuda() and _machine_without_cuda() in out  # the machine's one statement
    assert ip.user_ns["t"].unavailable


def test_traced_cell_keeps_the_users_exception(ip, monkeypatch, capsys):
    import gpunb.readings.torch_state as torch_state

    sim = recorded_torch()
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    r = ip.run_cell("%%gpumem --trace -o t\ny = 1\nraise KeyError('mine')")
    assert not r.success and isinstance(r.error_in_exec, KeyError)
    assert ip.user_ns["y"] == 1 and ip.user_ns["t"].error == "KeyError"
    assert not sim.cuda.enabled  # the history is off again
    out = capsys.readouterr()
    assert "gpunb memory trace" in out.out and "KeyError" in out.out + out.err


def test_trace_arguments(ip, monkeypatch, capsys):
    import gpunb.readings.torch_state as torch_state

    with pytest.raises(UsageError, match="start the cell with %%gpumem --trace"):
        ip.run_line_magic("gpumem", "--trace")
    with pytest.raises(UsageError, match="is for the line magic"):
        ip.run_cell_magic("gpumem", "--trace on", "x = 1")
    with pytest.raises(UsageError, match="does not combine"):
        ip.run_line_magic("gpumem", "--trace on --top 3")
    sim = recorded_torch()
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    ip.run_line_magic("gpumem", "--trace on")
    kernel = ip._gpunb_extension_state.kernel
    assert sim.cuda.enabled and kernel.alloc_history is not None
    assert sim.cuda.history_calls[0]["max_entries"] == 20_000
    ip.run_line_magic("gpumem", "--trace off")
    assert not sim.cuda.enabled and kernel.alloc_history is None
    assert "allocation history on" in capsys.readouterr().out


def test_armed_doctor_adds_the_lines(ip, cells):
    from gpunb.analysis.memory.oom import diagnose
    from gpunb.readings.alloc_history import HistoryRecording
    from gpunb.shells.oom_hook import _add_sites
    from tests.simulated_alloc_history import HistoryCuda, HistoryTorch

    sim = HistoryTorch(HistoryCuda(oom_snapshot(), baseline=12 * GiB, peak=12 * GiB))
    exc = RuntimeError(RECORDING["oom_error"])
    d = diagnose(exc)
    ip.compile._filename_map.update(cells)
    _add_sites(ip, d, HistoryRecording(sim), sim)
    assert d.alloc_sites is not None and "In [6] line 2: too_big" in d.alloc_sites.failed_at
    text = str(d)
    assert "Failed request (10.00 GiB): In [6] line 2: too_big = torch.empty" in text
    assert "Largest live memory by line:\n    12.00 GiB  In [5] line 5: keep" in text  # size first, a line each
    assert text.index("Failed request") < text.index("What to do")
    html = d._repr_mimebundle_()["text/html"]
    assert "Failed request" in html
    # the live lines are a table, size first: in one sentence the size trailed a long line of code
    assert re.search(r"<td[^>]*>12\.00 GiB</td><td[^>]*>In \[5\] line 5: keep", html)
    assert d.to_dict()["alloc_sites"]["requested_bytes"] == 10 * GiB


def test_unload_switches_the_armed_history_off(ip, monkeypatch):
    import gpunb.readings.torch_state as torch_state

    sim = recorded_torch()
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    ip.run_line_magic("gpumem", "--trace on")
    assert sim.cuda.enabled
    ip.run_line_magic("unload_ext", "gpunb")
    assert not sim.cuda.enabled
    ip.run_line_magic("load_ext", "gpunb")


def test_a_traced_cells_lines_are_numbered_as_the_user_sees_them(ip, monkeypatch):
    """Real IPython frames (no GPU): a stand-in allocator records the Python stack of each call as
    torch's history does (innermost first), so the cell's own numbering is what is checked."""
    import inspect

    import gpunb.readings.torch_state as torch_state
    from tests.simulated_alloc_history import HistoryCuda, HistoryTorch

    events: list[dict] = []
    sim = HistoryTorch(HistoryCuda({"segments": [], "device_traces": [events]}, baseline=0, peak=3 * MiB))

    def alloc(nbytes):  # what torch.empty would record: the caller's frames, innermost first
        frames = [{"filename": f.filename, "line": f.lineno, "name": f.function} for f in inspect.stack()[1:]]
        events.append({"action": "alloc", "addr": len(events) * 2**24, "size": nbytes, "frames": frames})

    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    ip.user_ns["alloc"] = alloc
    ip.run_cell("def helper():\n    alloc(2 * 2**20)\n", store_history=True)
    r = ip.run_cell("%%gpumem --trace -o t\nalloc(2**20)\n\nhelper()", store_history=True)
    assert r.success
    n = r.execution_count
    sites = ip.user_ns["t"].sites_at_peak
    assert [s.label for s in sites] == [f"In [{n - 1}] line 2: alloc(2 * 2**20)", f"In [{n}] line 2: alloc(2**20)"]
    assert sites[0].stack == (f"In [{n}] line 4: helper()", f"In [{n - 1}] line 2: alloc(2 * 2**20)")
    assert ip.user_ns["t"].peak_bytes == 3 * MiB


def test_an_oom_inside_a_traced_cell_is_the_headline(cells):
    from tests.simulated_alloc_history import HistoryCuda, HistoryTorch

    sim = HistoryTorch(HistoryCuda(oom_snapshot(), baseline=0, peak=12 * GiB))
    session = TraceSession(torch=sim, namespace={}, cell_numbers=lambda: cells)
    session.start()
    trace = session.stop(RuntimeError("CUDA out of memory"))
    assert trace.headline.startswith("out of memory at In [6] line 2: too_big = torch.empty(10 * 2**30")
    assert "asking 10.00 GiB, with 12.00 GiB allocated at the peak" in trace.headline
    assert trace.peak_bytes == 12 * GiB


def test_a_hostile_namespace_does_not_stop_the_trace(ip, monkeypatch):
    import gpunb.readings.torch_state as torch_state
    from tests.hostile_objects import UNBOUND_PROXY

    sim = recorded_torch()
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    ip.run_cell(UNBOUND_PROXY + "\nu = UnboundProxy(ContextVar('u'))\n"
                "class Raising(dict):\n    def items(self):\n        raise RuntimeError('no items')\nd = Raising(a=1)")
    r = ip.run_cell("%%gpumem --trace -o t\nz = 5\nz")
    assert r.success and r.result == 5
    t = ip.user_ns["t"]
    assert not t.unavailable and t.peak_bytes == RECORDING["max_memory_allocated_train"]
    assert not sim.cuda.enabled


def test_save_is_said_with_its_size_at_a_glance(cells, tmp_path):
    sim = recorded_torch()
    path = tmp_path / "snap.pickle"
    session = TraceSession(torch=sim, namespace={}, cell_numbers=lambda: cells, save_path=str(path))
    session.start()
    trace = session.stop()
    assert trace.saved_bytes == path.stat().st_size
    text = str(trace)
    assert f"snapshot saved to {path}" in text and text.index("snapshot saved") < text.index("Details:")
    html = trace._repr_mimebundle_()["text/html"]
    assert html.index("snapshot saved") < html.index("<details")
    again = TraceSession(torch=recorded_torch(), namespace={}, cell_numbers=lambda: cells, save_path=str(path))
    again.start()
    kept = again.stop()
    assert not kept.saved_path and any("already exists" in n for n in kept.notes)


@contextlib.contextmanager
def _full_disk():
    """A folder on a filesystem with almost no room: a real tmpfs of 16 KiB where this may mount
    (root: CI), else None (the fake write below stands in)."""
    import subprocess
    import tempfile

    where = tempfile.mkdtemp(prefix="gpunb-full-")
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", where],
                                                   capture_output=True).returncode == 0
    try:
        yield where if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", where], capture_output=True)
        os.rmdir(where)


def test_a_save_on_a_full_disk_leaves_no_partial_file_and_a_note_not_an_exception(cells, tmp_path, monkeypatch):
    """Issue 31: a full disk raised OSError out of the traced cell and left half a pickle."""
    import errno

    from gpunb.readings import alloc_history

    with _full_disk() as full:
        if full is None:  # no tmpfs to fill: the pickle's write fails half-way instead
            full = str(tmp_path)

            def half_then_full(obj, f):
                f.write(b"\x80\x04half a pickle")
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(alloc_history.pickle, "dump", half_then_full)
        path = os.path.join(full, "snap.pickle")
        session = TraceSession(torch=recorded_torch(), namespace={}, cell_numbers=lambda: cells, save_path=path)
        session.start()
        trace = session.stop()  # never raises
        assert not trace.saved_path and trace.saved_bytes is None
        assert any("No space left on device" in n and "nothing was left behind" in n for n in trace.notes)
        assert os.listdir(full) == []
