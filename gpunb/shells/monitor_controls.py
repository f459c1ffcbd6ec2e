"""The live monitor's controls: Pause/Resume, Stop and the time window, as core ipywidgets
(no custom JavaScript: they render offline in JupyterLab, Notebook 7, VS Code and Colab).

The controls are their own output, above the monitor's frame; the frame stays a plain HTML
output that the sampler thread redraws (:mod:`gpunb.shells.monitor`). A saved notebook keeps
the frame, never a widget:

- when the monitor stops, the controls' output is replaced by nothing (an empty text), so a
  notebook saved afterwards holds no widget at all;
- a notebook saved while the monitor runs would hold the controls' widget reference, which
  reopens as "Error displaying widget: model not found". gpunb's Jupyter server extension
  removes the outputs marked :data:`CONTROLS_MARK` when the notebook is saved
  (:func:`gpunb.shells.save_hook.drop_live_controls`); the open notebook keeps them.

Button clicks arrive as comm messages on the kernel's shell channel, queued behind a running
cell. On ipykernel 7 gpunb routes them to a kernel subshell (:mod:`gpunb.shells.widget_channel`)
so Pause, Stop and the window act while a training cell runs; where that is not available they
act when the cell ends (``%gpumonitor --stop`` and ``Kernel → Interrupt`` work as always).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpunb.analysis.monitor.sampler import WINDOW_MAX_S, WINDOW_MIN_S
from gpunb.shells.save_hook import CONTROLS_MARK
from gpunb.views.chart import span_words
from gpunb.views.monitor_layout import OVERVIEW_FROM

if TYPE_CHECKING:
    from gpunb.shells.monitor import Monitor

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# The time windows offered (the monitor's own, if another, is added to them).
WINDOWS_S = (30.0, 120.0, 600.0, 3600.0)


# The range pyproject.toml declares. Older ipywidgets (7.x) pairs with a different frontend
# protocol: the controls never drew, yet each monitor left 14 comms open and each check 3.
WIDGETS_MIN = (8, 1)
_told_old_widgets = False


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def widgets_problem() -> str:
    """Why gpunb shows no widgets here ("" when it can): ipywidgets missing or outside the range."""
    try:
        import ipywidgets
    except ImportError as exc:
        if getattr(exc, "name", None) == "ipywidgets":
            return "ipywidgets is not installed"
        return f"ipywidgets could not be imported ({exc}); fix: `pip install -U 'ipywidgets>=8.1'`"
    version = str(getattr(ipywidgets, "__version__", "0"))
    if _version_tuple(version) < WIDGETS_MIN:
        return (f"ipywidgets {version} is older than the {'.'.join(map(str, WIDGETS_MIN))} gpunb's controls need, "
                "so the monitor is shown without Pause/Stop/window controls and no Cancel button; "
                "fix: `pip install -U 'ipywidgets>=8.1'` and restart the kernel")
    return ""


def widgets_available() -> bool:
    """True when the supported ipywidgets can be used. Outside the range nothing is opened
    (no comm, no subshell) and the reason is said once per kernel on stderr."""
    global _told_old_widgets
    problem = widgets_problem()
    if problem and problem.startswith("ipywidgets ") and "older" in problem and not _told_old_widgets:
        _told_old_widgets = True
        import sys

        print(f"gpunb: {problem}.", file=sys.stderr)
    return not problem


class MonitorControls:
    """Pause/Resume, Stop and the time window of one monitor; ``show()`` displays them,
    ``remove()`` replaces them with nothing (called when the monitor stops)."""

    def __init__(self, monitor: Monitor) -> None:
        import ipywidgets as w

        self.monitor = monitor
        windows = sorted({*WINDOWS_S, float(monitor.window_s)})
        options = [(span_words(s), s) for s in windows if WINDOW_MIN_S <= s <= WINDOW_MAX_S]
        self.pause = w.ToggleButton(value=False, description="Pause", icon="pause",
                                    tooltip="Freeze the charts (sampling goes on; Resume shows the latest)",
                                    layout=w.Layout(width="96px"))
        self.stop = w.Button(description="Stop", icon="stop", tooltip="Stop this monitor; its last frame stays",
                             layout=w.Layout(width="80px"))
        self.window = w.Dropdown(options=options, value=float(monitor.window_s), description="window",
                                 tooltip="How much history the charts show",
                                 layout=w.Layout(width="170px"), style={"description_width": "50px"})
        self.each_gpu = w.ToggleButton(value=False, description="Each GPU", icon="th-large",
                                       tooltip="Show each GPU's own charts under the overview",
                                       layout=w.Layout(width="110px"))
        several = len(monitor.sampler.gpu_series(monitor.devices)) >= OVERVIEW_FROM
        buttons = [self.pause, self.stop, self.window] + ([self.each_gpu] if several else [])
        self.box = w.HBox(buttons, layout=w.Layout(margin="0 0 4px 0"))
        self.box.add_class("gpunb-monitor-controls")
        self.pause.observe(self._on_pause, names="value")
        self.stop.on_click(self._on_stop)
        self.window.observe(self._on_window, names="value")
        self.each_gpu.observe(self._on_each_gpu, names="value")
        self._handle: Any = None
        self.act_while_cells_run = False  # clicks go to a kernel subshell (widget_channel)

    # -- what the user does ------------------------------------------------------------
    def _on_pause(self, change: dict[str, Any]) -> None:
        paused = bool(change["new"])
        self.pause.description, self.pause.icon = ("Resume", "play") if paused else ("Pause", "pause")
        self.monitor.set_paused(paused)

    def _on_stop(self, _button: Any) -> None:
        self.monitor.stop()

    def _on_window(self, change: dict[str, Any]) -> None:
        self.monitor.set_window(float(change["new"]))

    def _on_each_gpu(self, change: dict[str, Any]) -> None:
        self.monitor.set_each_gpu(bool(change["new"]))

    # -- the output --------------------------------------------------------------------
    def bundle(self) -> dict[str, Any]:
        data = dict(self.box._repr_mimebundle_())
        data["text/plain"] = "gpunb monitor controls (Pause, Stop, time window)"
        return data

    def show(self) -> None:
        from IPython.display import display

        self._handle = display(self.bundle(), raw=True, display_id=True, metadata={CONTROLS_MARK: True})
        from gpunb.shells.session import current_shell
        from gpunb.shells.widget_channel import route_clicks

        kernel = getattr(current_shell(), "kernel", None)
        self.act_while_cells_run = route_clicks(
            [self.box, self.pause, self.stop, self.window, self.each_gpu, *self.box.children], kernel)

    def remove(self) -> None:
        """The monitor stopped: the controls give way to nothing (the frame below stays)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.update({"text/plain": ""}, raw=True, metadata={})
            except Exception:  # no kernel any more (shutdown): nothing to update
                pass
        close_widgets(self.box, self.pause, self.stop, self.window, self.each_gpu)


def close_widgets(*widgets: Any) -> None:
    """Close widgets with their layout and style (each its own widget, with its own comm and
    an entry in ipywidgets' registry: left open, a thousand monitors kept 18 MB)."""
    for widget in widgets:
        for part in (getattr(widget, "layout", None), getattr(widget, "style", None), widget):
            try:
                if part is not None:
                    part.close()
            except Exception:  # closing twice, or the comm is gone: nothing left to do
                pass
