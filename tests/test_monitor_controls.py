"""The live monitor's controls (ipywidgets): Pause/Resume, Stop, the time window; they give
way when the monitor stops, and the server's save hook keeps them out of a saved notebook."""

from __future__ import annotations

import threading
import time

import pytest
from IPython.utils.capture import capture_output

import gpunb
from gpunb.shells.kernel_state import STANDALONE_STATE
from gpunb.shells.monitor import stop_all
from gpunb.shells.save_hook import CONTROLS_MARK, drop_live_controls

pytest.importorskip("ipywidgets")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(autouse=True)
def no_leftover_sampler(ip, monkeypatch):
    monkeypatch.setattr(ip, "kernel", object(), raising=False)  # a Jupyter kernel: controls are shown
    yield
    stop_all(STANDALONE_STATE)
    STANDALONE_STATE.sampler = None


def _show(mon):
    """Display ``mon``; return (controls output, frame output, frames sent later, controls updates)."""
    with capture_output() as out:
        mon._ipython_display_()
    controls, frame = out.outputs
    sent: list = []
    mon._handles[0].update = lambda data, raw=False: sent.append((threading.current_thread().name, data))
    changes: list = []
    mon.controls._handle.update = lambda data, raw=False, metadata=None: changes.append((data, metadata))
    return controls, frame, sent, changes


def test_controls_are_their_own_output_above_the_frame_and_marked_not_to_save(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    controls, frame, _, _ = _show(mon)
    assert WIDGET_VIEW in controls.data and controls.metadata.get(CONTROLS_MARK) is True
    assert WIDGET_VIEW not in frame.data and "gpunb-monitor" in frame.data["text/html"]  # the frame is plain HTML
    names = [w.description for w in (mon.controls.pause, mon.controls.stop)]
    assert names == ["Pause", "Stop"] and mon.controls.window.value == 120.0
    mon.stop()


def test_pause_freezes_the_picture_while_sampling_goes_on_and_resume_shows_the_latest(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    _, _, sent, _ = _show(mon)
    time.sleep(0.5)
    mon.controls.pause.value = True  # what a click does
    assert mon.paused and mon.controls.pause.description == "Resume"
    assert "paused at" in sent[-1][1]["text/html"]
    frames, ticks = len(sent), mon.sampler.ticks
    time.sleep(0.6)
    assert len(sent) == frames and mon.sampler.ticks > ticks + 3  # no redraw, but still sampling
    mon.controls.pause.value = False
    assert not mon.paused and "last sample" in sent[-1][1]["text/html"]
    time.sleep(0.5)
    assert len(sent) > frames + 1  # the thread draws again
    mon.stop()


def test_the_window_control_changes_what_the_charts_show(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, window_s=60, frontend="live")
    _, _, sent, _ = _show(mon)
    assert [v for _, v in mon.controls.window.options] == [30.0, 60.0, 120.0, 600.0, 3600.0]
    mon.controls.window.value = 600.0
    assert mon.window_s == 600.0 and "10 min window" in sent[-1][1]["text/html"]
    mon.stop()


@pytest.mark.parametrize("fake_nvml", ["two-gpus"], indirect=True)
def test_each_gpu_shows_each_gpus_panels_under_the_overview(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    _, _, sent, _ = _show(mon)
    assert mon.controls.each_gpu in mon.controls.box.children  # two GPUs: the button is there
    time.sleep(0.3)
    live = mon._live_bundle()["text/html"]
    assert "gpunb-overview" in live and 'class="gpunb-gpu"' not in live and "Each GPU" in live
    mon.controls.each_gpu.value = True  # what a click does
    assert mon.each_gpu and '<details class="gpunb-per-gpu" open' in sent[-1][1]["text/html"]
    assert sent[-1][1]["text/html"].count('class="gpunb-gpu"') == 2
    mon.stop()  # the stopped frame keeps them one click away
    assert '<details class="gpunb-per-gpu"' in sent[-1][1]["text/html"]


def test_one_gpu_has_no_each_gpu_button(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    _show(mon)
    assert mon.controls.each_gpu not in mon.controls.box.children
    mon.stop()


def test_stop_leaves_the_frame_and_the_controls_give_way(ip, fake_nvml):
    mon = gpunb.monitor(hz=10, frontend="live")
    _, _, sent, changes = _show(mon)
    mon.controls.stop.click()
    assert not mon.running and "stopped at" in sent[-1][1]["text/html"]
    assert changes == [({"text/plain": ""}, {})]  # nothing where the buttons were: no widget to save
    assert mon.controls.box.comm is None  # the widgets are closed


def test_without_ipywidgets_the_monitor_shows_its_frame_alone(ip, fake_nvml, monkeypatch):
    import gpunb.shells.monitor_controls as controls_module

    monkeypatch.setattr(controls_module, "widgets_available", lambda: False)
    mon = gpunb.monitor(hz=10, frontend="live")
    with capture_output() as out:
        mon._ipython_display_()
    assert len(out.outputs) == 1 and "gpunb-monitor" in out.outputs[0].data["text/html"] and mon.controls is None
    mon.stop()


def _notebook(outputs):
    return {"type": "notebook", "content": {"cells": [
        {"cell_type": "markdown", "source": "x"},
        {"cell_type": "code", "outputs": outputs},
    ]}}


def test_the_save_hook_drops_only_the_marked_controls():
    controls = {"output_type": "display_data", "data": {WIDGET_VIEW: {"model_id": "abc"}, "text/plain": "c"},
                "metadata": {CONTROLS_MARK: True}}
    frame = {"output_type": "display_data", "data": {"text/html": "<div class='gpunb-monitor'></div>"},
             "metadata": {}}
    other_widget = {"output_type": "display_data", "data": {WIDGET_VIEW: {"model_id": "x"}}, "metadata": {}}
    model = _notebook([controls, frame, other_widget])
    drop_live_controls(model=model, path="a.ipynb", contents_manager=None)
    assert model["content"]["cells"][1]["outputs"] == [frame, other_widget]  # someone else's widget is theirs
    text_file = {"type": "file", "content": "not a notebook"}
    drop_live_controls(model=text_file)
    assert text_file == {"type": "file", "content": "not a notebook"}
    drop_live_controls(model={"type": "notebook", "content": {"cells": "garbage"}})  # no crash on odd shapes


def test_the_server_extension_registers_the_save_hook():
    from gpunb.shells import server_extension

    class Contents:
        def __init__(self) -> None:
            self.hooks: list = []

        def register_pre_save_hook(self, hook):
            self.hooks.append(hook)

    class App:
        contents_manager = Contents()
        kernel_manager = None
        log = type("Log", (), {"info": staticmethod(lambda *a, **k: None)})()
        web_app = type("Web", (), {"settings": {"base_url": "/"}, "add_handlers": lambda self, *a: None})()

    server_extension._load_jupyter_server_extension(App())
    assert App.contents_manager.hooks == [drop_live_controls]


class _Socket:
    def __init__(self, reply, answers=True):
        self.reply, self.answers, self.sent = reply, answers, []

    def send_json(self, obj):
        self.sent.append(obj)

    def poll(self, timeout_ms):
        return self.answers

    def recv_json(self):
        return self.reply


def _kernel(socket, subshells=()):
    class Pair:
        from_socket = socket

    class Manager:
        control_to_shell_channel = Pair()

        def list_subshell(self):
            return list(subshells)

    class Thread:
        manager = Manager()

    class Kernel:
        _supports_kernel_subshells = True
        shell_channel_thread = Thread()

    return Kernel()


class _Comm:
    def _reply_subshell_for(self, data, default):
        return getattr(self, "_reply_subshell_id", default)


class _Widget:
    def __init__(self):
        self.comm = _Comm()


def test_clicks_are_routed_to_one_subshell_per_kernel():
    from gpunb.shells.widget_channel import route_clicks

    socket = _Socket({"status": "ok", "subshell_id": "sub-1"})
    kernel = _kernel(socket, subshells=["sub-1"])
    a, b = _Widget(), _Widget()
    assert route_clicks([a], kernel) and a.comm._reply_subshell_id == "sub-1"
    assert route_clicks([b], kernel) and b.comm._reply_subshell_id == "sub-1"
    assert socket.sent == [{"type": "create"}]  # one subshell, asked for once


def test_without_subshells_the_controls_act_between_cells():
    from gpunb.shells.widget_channel import route_clicks

    assert not route_clicks([_Widget()], None)
    silent = _Socket(None, answers=False)  # the shell channel thread does not answer
    kernel = _kernel(silent)
    assert not route_clicks([_Widget()], kernel) and not route_clicks([_Widget()], kernel)
    assert silent.sent == [{"type": "create"}]  # not asked again: no stray reply later
    refused = _kernel(_Socket({"status": "error", "evalue": "no"}))
    widget = _Widget()
    assert not route_clicks([widget], refused) and not hasattr(widget.comm, "_reply_subshell_id")


def test_unload_ext_ends_the_controls_subshell(ip, monkeypatch):
    from gpunb.shells.widget_channel import close_controls_subshell, controls_subshell

    socket = _Socket({"status": "ok", "subshell_id": "sub-9"})
    kernel = _kernel(socket, subshells=["sub-9"])
    monkeypatch.setattr(ip, "kernel", kernel, raising=False)
    assert controls_subshell(kernel) == "sub-9"
    ip.run_line_magic("unload_ext", "gpunb")
    assert socket.sent == [{"type": "create"}, {"type": "delete", "subshell_id": "sub-9"}]
    assert not close_controls_subshell(kernel)  # ended once; nothing left to end
    ip.run_line_magic("load_ext", "gpunb")  # the fixture unloads it
