"""%gpumonitor and gpunb.monitor() in-process: flags, sharing one sampler, the live output
redrawn in place, the stopped frame, stopping on close/unload/reload."""

from __future__ import annotations

import sys
import threading
import time
from html import escape

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import gpunb
from gpunb.analysis.machine import NO_GPU
from gpunb.analysis.monitor.sampler import THREAD_NAME
from gpunb.shells.extension import state_of
from gpunb.shells.kernel_state import STANDALONE_STATE
from gpunb.shells.monitor import Monitor, stop_all

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
DATA_URI = 'src="data:image/svg+xml;base64,'


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture(autouse=True)
def no_leftover_sampler():
    yield
    stop_all(STANDALONE_STATE)
    STANDALONE_STATE.sampler = None
    assert STANDALONE_STATE.monitors == [] and sampler_threads() == []


class Shown:
    """What a cell printed and displayed (display() goes to ``outputs``, not stdout)."""

    def __init__(self, out) -> None:
        shown = [o.data.get("text/plain", "") for o in out.outputs]
        self.stdout = out.stdout + "\n".join(shown)
        self.stderr = out.stderr
        self.outputs = out.outputs


def run(ip, line: str):
    with capture_output() as out:
        result = ip.run_cell(line)
    return result, Shown(out)


def test_magic_starts_one_shared_sampler_and_prints_a_text_line(ip, fake_nvml):
    result, out = run(ip, "%gpumonitor -o mon")
    assert result.success
    mon = ip.user_ns["mon"]
    assert isinstance(mon, Monitor)
    assert "GPU0 NVIDIA H200: util" in out.stdout and "host: CPU" in out.stdout
    assert "sampling goes on in the background" in out.stdout  # no widget frontend in-process
    assert state_of(ip).kernel.sampler is mon.sampler
    assert mon.hz == 2 and mon.window_s == 120 and mon.devices is None
    run(ip, "%gpumonitor --hz 5 --window 30 --device 0 -o mon2")
    mon2 = ip.user_ns["mon2"]
    assert mon2.sampler is mon.sampler and len(sampler_threads()) == 1  # shared, not doubled
    assert mon.hz == 5 and mon2.window_s == 30 and mon2.devices == (0,)
    result, out = run(ip, "%gpumonitor --stop")
    assert "stopped 2 monitor(s)" in out.stdout
    assert sampler_threads() == [] and not mon.running


@pytest.mark.parametrize(
    "line, words",
    [
        ("%gpumonitor --bogus", "unrecognized arguments: --bogus"),
        ("%gpumonitor --hz fast", "--hz: 'fast' is not a number (allowed: from 0.5 to 10)"),
        ("%gpumonitor --window 0", "--window: 0 is out of range (allowed: from 1 to 86400)"),
        ("%gpumonitor --hz 0", "--hz: 0 is out of range (allowed: from 0.5 to 10)"),
        ("%gpumonitor --hz 50", "--hz: 50 is out of range (allowed: from 0.5 to 10)"),
        ("%gpumonitor --device 3", "there is no GPU 3: NVML sees 1 GPU(s), indices 0"),
    ],
)
def test_bad_flags_give_usage_not_a_traceback(ip, fake_nvml, line, words):
    result, out = run(ip, line)
    assert isinstance(result.error_in_exec, UsageError)
    message = str(result.error_in_exec)
    assert words in message
    assert "usage: %gpumonitor [--hz HZ] [--window SECONDS] [--device N] [--stop] [-o NAME]" in message
    assert "See %gpumonitor? for every option." in message
    assert "Traceback" not in out.stdout + out.stderr
    assert sampler_threads() == []


def test_api_rate_above_the_maximum_is_clamped_and_said(fake_nvml):
    """The magic refuses --hz 50 (above); the Python twin clamps and says so."""
    mon = gpunb.monitor(hz=50, frontend="text")
    assert mon.hz == 10 and any("50 Hz is above the 10 Hz maximum" in m for m in mon.messages)
    mon.stop()


def test_help_is_the_docstring(ip):
    doc = ip.find_line_magic("gpumonitor").__doc__
    assert "--window SECONDS" in doc and "charts" in doc and "saved" in doc


def test_unload_and_reload_stop_the_thread(ip, fake_nvml):
    run(ip, "%gpumonitor")
    assert len(sampler_threads()) == 1
    ip.run_line_magic("reload_ext", "gpunb")
    assert sampler_threads() == []
    assert state_of(ip).kernel.sampler is None
    run(ip, "%gpumonitor")
    assert len(sampler_threads()) == 1
    ip.run_line_magic("unload_ext", "gpunb")
    assert sampler_threads() == []
    ip.run_line_magic("load_ext", "gpunb")  # the fixture unloads once more


def test_hundred_load_unload_cycles_leave_no_thread(ip, fake_nvml):
    for _i in range(100):
        ip.run_line_magic("unload_ext", "gpunb")
        ip.run_line_magic("load_ext", "gpunb")
        with capture_output():
            ip.run_line_magic("gpumonitor", "--hz 10")
        assert len(sampler_threads()) == 1
    ip.run_line_magic("unload_ext", "gpunb")
    assert sampler_threads() == []
    ip.run_line_magic("load_ext", "gpunb")


def test_api_samples_are_columns_and_pandas_is_optional(fake_nvml, monkeypatch):
    mon = gpunb.monitor(hz=10, frontend="text")
    time.sleep(0.35)
    cols = mon.samples()
    assert len(cols["t_s"]) >= 3
    assert {"gpu0_util_pct", "gpu0_mem_other_mib", "cpu_pct", "ram_used_mib"} <= set(cols)
    assert all(len(v) == len(cols["t_s"]) for v in cols.values())
    d = mon.to_dict()
    assert d["gpus"][0]["name"] == "NVIDIA H200" and d["running"] and d["hz"] == 10
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        mon.to_pandas()
    mon.stop()
    assert not mon.running and sampler_threads() == []
    assert len(mon.samples()["t_s"]) >= len(cols["t_s"])  # the data outlives the thread


def test_to_pandas_when_installed(fake_nvml):
    pd = pytest.importorskip("pandas")
    mon = gpunb.monitor(frontend="text")
    frame = mon.to_pandas()
    mon.stop()
    assert isinstance(frame, pd.DataFrame) and "gpu0_power_w" in frame.columns and len(frame) >= 1


def test_bad_api_arguments_say_what_to_do(fake_nvml):
    with pytest.raises(ValueError, match="hz must be a number"):
        gpunb.monitor(hz="2")
    for bad in ("first", "01", 1.0, [0, "1"], True):
        with pytest.raises(ValueError, match="device must be a GPU index"):
            gpunb.monitor(device=bad)
    with pytest.raises(ValueError, match="empty"):
        gpunb.monitor(device=[])
    assert gpunb.monitor(device=[0], frontend="text").devices == (0,)
    with pytest.raises(ValueError, match="frontend"):
        gpunb.monitor(frontend="tv")
    stop_all(STANDALONE_STATE)


@pytest.mark.parametrize("fake_nvml", ["no-driver"], indirect=True)
def test_no_gpu_monitors_the_host_and_says_so(ip, fake_nvml):
    _, out = run(ip, "%gpumonitor -o mon")
    assert out.stdout.count(NO_GPU.sentence) == 1 and "host: CPU" in out.stdout
    html = ip.user_ns["mon"]._repr_mimebundle_()["text/html"]
    assert html.count(escape(NO_GPU.sentence)) == 1 and "--gpus all" not in html
    run(ip, "%gpumonitor --stop")


def _displayed(mon) -> tuple[dict, list]:
    """Display ``mon``; return the first bundle and a list that collects every later
    update (with the name of the thread that sent it)."""
    with capture_output() as out:
        mon._ipython_display_()
    sent = []
    mon._handles[0].update = lambda data, raw=False: sent.append((threading.current_thread().name, data))
    frame = next(o for o in out.outputs if "text/html" in o.data)  # (the controls, if any, come first)
    return frame.data, sent


def test_live_output_is_html_redrawn_in_place_by_the_sampler_thread(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    bundle, sent = _displayed(mon)
    assert WIDGET_VIEW not in bundle  # no widget: nothing says "model not found" once reopened
    # One reading so far: each chart shows it as a dot (the host CPU, which needs two
    # readings for a percentage, a box saying it waits).
    assert bundle["text/html"].count(DATA_URI) >= 6 and "<svg" not in bundle["text/html"]
    assert "GPU0 NVIDIA H200" in bundle["text/plain"] and "last sample" in bundle["text/html"]
    time.sleep(0.8)
    frames = [data for thread, data in sent if thread == THREAD_NAME]
    assert len(frames) >= 2 and frames[-1]["text/html"] != bundle["text/html"]  # redrawn from the thread
    assert all(set(f) == {"text/html", "text/plain"} for f in frames) and frames[-1]["text/html"].count(DATA_URI) >= 7
    mon.stop()
    assert not mon.running and sampler_threads() == []
    last = sent[-1][1]["text/html"]
    assert "stopped at" in last and last.count(DATA_URI) >= 7  # the last frame, saying when it stopped
    count = len(sent)
    time.sleep(0.3)
    mon.stop()  # idempotent
    assert len(sent) == count


def test_the_frame_that_stays_is_the_last_one(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    _, sent = _displayed(mon)
    time.sleep(0.6)
    mon.stop()
    stopped = sent[-1][1]["text/html"]
    ticks_at_stop = mon.sampler.ticks
    latest = mon.window().t_s[-1]
    # The stopped frame ends at the sampler's very last reading, not at an older frame.
    assert mon.sampler.ticks == ticks_at_stop
    from gpunb.views.monitor_layout import clock_time

    assert clock_time(mon.sampler.started_unix, latest) in stopped


def test_two_live_monitors_share_the_thread_until_the_last_stops(ip, fake_nvml):
    a = gpunb.monitor(frontend="live")
    b = gpunb.monitor(frontend="live")
    _displayed(a)
    _displayed(b)
    assert len(sampler_threads()) == 1
    a.close()
    assert not a.running and b.running and len(sampler_threads()) == 1
    b.close()
    assert sampler_threads() == []


def test_rerunning_the_same_cell_replaces_its_monitor(ip, fake_nvml, monkeypatch):
    def cell(cell_id: str, run_id: str) -> None:
        header = {"metadata": {"cellId": cell_id}, "header": {"msg_id": run_id}}
        monkeypatch.setattr(ip, "parent_header", header, raising=False)

    cell("cell-1", "run-1")
    run(ip, "%gpumonitor -o first\n%gpumonitor --device 0 -o first_b")  # one run: both stay
    first, first_b = ip.user_ns["first"], ip.user_ns["first_b"]
    assert first.running and first_b.running
    cell("cell-1", "run-2")  # the same cell run again: its old monitors go
    run(ip, "%gpumonitor -o second")
    second = ip.user_ns["second"]
    assert not first.running and not first_b.running and second.running and len(sampler_threads()) == 1
    assert state_of(ip).kernel.monitors == [second]
    cell("cell-2", "run-3")
    run(ip, "%gpumonitor -o third")
    assert second.running and ip.user_ns["third"].running
    run(ip, "%gpumonitor --stop")


def test_extension_load_does_not_import_the_monitor_machinery():
    import subprocess

    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'gpunb')\n"
        "print(sorted(m for m in ('torch', 'ipywidgets', 'pynvml', 'gpunb.shells.monitor') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stdout and "ipywidgets" not in out.stdout and "gpunb.shells.monitor" not in out.stdout


def test_overhead_benchmark_runs_on_cpu(tmp_path):
    import json
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "monitor_overhead.py"
    out = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "--smoke", "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "monitor_overhead.json").read_text())
    assert set(data["info"]["loop_shapes"]) == {"launch-bound", "compute-bound"}
    for loop in ("launch-bound", "compute-bound"):
        rows = data["results"][loop]["variants"]
        assert set(rows) == {"off", "2 Hz base", "2 Hz", "10 Hz base", "10 Hz"}  # base: without energy/links
        assert all(r["step_ms_median"] > 0 for r in rows.values())
        assert all(isinstance(rows[hz]["links_vs_base_median_paired"], float) for hz in ("2 Hz", "10 Hz"))
        assert rows["off"]["sampler_cpu_s_per_s"] == 0 and rows["10 Hz"]["sampler_cpu_s_per_s"] > 0
    assert data["info"]["panel_html_bytes"] > 1000 and "slowdown" in out.stdout


def test_monitor_started_before_load_ext_is_adopted(fake_nvml):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    if state_of(shell) is not None:
        shell.run_line_magic("unload_ext", "gpunb")
    mon = gpunb.monitor(frontend="text")
    assert STANDALONE_STATE.sampler is mon.sampler and STANDALONE_STATE.monitors == [mon]
    shell.run_line_magic("load_ext", "gpunb")
    try:
        kernel = state_of(shell).kernel
        assert kernel.sampler is mon.sampler and kernel.monitors == [mon] and mon.kernel_state is kernel
        assert STANDALONE_STATE.sampler is None and STANDALONE_STATE.monitors == []
        mon.stop()
        assert kernel.monitors == [] and sampler_threads() == []
    finally:
        shell.run_line_magic("unload_ext", "gpunb")
