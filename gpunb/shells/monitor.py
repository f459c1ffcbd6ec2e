"""``gpunb.monitor()``: live GPU charts that keep drawing while other cells run.

A :class:`Monitor` is one view on the kernel's single :class:`~gpunb.analysis.monitor.sampler.Sampler`
(kept in the kernel's :class:`~gpunb.shells.kernel_state.KernelState`, so several
monitors share one thread and a new one never starts a second).

In a Jupyter kernel the monitor is an ordinary ``text/html`` output that the sampler
thread replaces in place (``update_display_data`` by display id, which JupyterLab,
Notebook 7, VS Code and nbclient route to the output whatever cell runs meanwhile). The
frame is deliberately not a widget: a widget output saved in a notebook shows "Error
displaying widget: model not found" once reopened, while this output is always the latest
frame, so a notebook saved mid-training shows the charts as they were at the save, and a
stopped monitor's output says when it stopped. What the user does (Pause, Stop, the time
window) are ipywidgets in their own output above the frame, which give way to nothing when
the monitor stops (:mod:`gpunb.shells.monitor_controls`). The charts are data-URI images
(see :mod:`gpunb.views.chart`), which untrusted notebooks keep. Without a Jupyter frontend
(terminal IPython, plain Python) it shows one text line per GPU.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from gpunb.analysis.energy.tariff import session_tariff
from gpunb.analysis.machine import without_gpu
from gpunb.analysis.monitor.sampler import HZ_DEFAULT, WINDOW_MAX_S, WINDOW_MIN_S, Sampler, clamp_hz, gpu_column
from gpunb.analysis.monitor.series import Window
from gpunb.display import DisplayMixin, Render
from gpunb.shells.extension import kernel_state
from gpunb.shells.kernel_state import KernelState
from gpunb.shells.session import current_shell
from gpunb.views.imbalance_view import imbalance_text
from gpunb.views.monitor_layout import caption, clock_time, monitor_html, monitor_text, panel_html, panel_notes
from gpunb.views.sparkline import SparkPanel

# Redraw at most this often; faster sampling still records every reading (each frame is
# sent to the frontend whole, tens of KB for eight GPUs).
MIN_DRAW_INTERVAL_S = 0.25


def stop_all(state: KernelState | None = None) -> int:
    """Stop every monitor of ``state`` (default: the current kernel's; each leaves its last
    frame, captioned with the time it stopped) and the sampler thread. Returns how many
    monitors were live."""
    state = state if state is not None else kernel_state()
    monitors = list(state.monitors)
    for m in monitors:
        m.stop()
    if state.sampler is not None:
        state.sampler.stop()
    return len(monitors)


def _jupyter_frontend(shell: Any) -> bool:
    """A Jupyter kernel (Lab, Notebook 7, VS Code, Colab) updates an output in place;
    terminal IPython and plain Python cannot."""
    return shell is not None and getattr(shell, "kernel", None) is not None


def _cell_run(shell: Any) -> tuple[str, str] | None:
    """(cell id, execution id) of the running cell (JupyterLab/Notebook 7 send the id),
    to replace a monitor when its cell is run again rather than keep feeding an
    invisible one; monitors made by one run of a cell all stay."""
    header = getattr(shell, "parent_header", None) if shell is not None else None
    if not isinstance(header, dict):
        return None
    cell = header.get("metadata", {}).get("cellId")
    run = header.get("header", {}).get("msg_id") or header.get("msg_id") or ""
    return (str(cell), str(run)) if cell else None


def _check_window(window_s: Any, hz: float) -> float:
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not math.isfinite(window_s):
        raise ValueError(f"window_s must be a number of seconds, got {window_s!r}")
    if not WINDOW_MIN_S <= window_s <= WINDOW_MAX_S:
        raise ValueError(f"window_s must be between {WINDOW_MIN_S:g} and {WINDOW_MAX_S:.0f} seconds (a day), "
                         f"got {window_s:g}")
    return float(window_s)


def _check_devices(device: Any, sampler: Sampler) -> tuple[int, ...] | None:
    if device is None:
        return None
    wanted = [device] if isinstance(device, int) and not isinstance(device, bool) else device
    try:
        if isinstance(wanted, (str, bytes)) or any(isinstance(d, bool) or not isinstance(d, int) for d in wanted):
            raise TypeError
        wanted = list(wanted)
    except TypeError:
        raise ValueError(f"device must be a GPU index (or a list of them), got {device!r}") from None
    if not wanted:
        raise ValueError("device is an empty list; leave it out (None) to show every GPU")
    have = [g.index for g in sampler.gpus]
    for d in wanted:
        if d not in have:
            if not have:
                raise ValueError(
                    f"there is no GPU {d} to monitor: no GPU is visible here "
                    f"({sampler.status.cause or 'NVML sees none'}). Leave out the device to monitor the host."
                )
            raise ValueError(
                f"there is no GPU {d}: NVML sees {len(have)} GPU(s), indices {', '.join(map(str, have))}. "
                "Pick one of those, or leave the device out to show all."
            )
    return tuple(wanted)


class Monitor(DisplayMixin):
    """One live view of the sampler: ``samples()``/``to_pandas()`` give the data,
    ``stop()`` (or ``close()``) ends it and leaves the last frame, captioned with the
    time it stopped, in the output."""

    def __init__(
        self,
        sampler: Sampler,
        kernel_state: KernelState,
        *,
        window_s: float,
        devices: tuple[int, ...] | None,
        live: bool,
        messages: Iterable[str] = (),
        cell_id: tuple[str, str] | None = None,
    ) -> None:
        self.sampler = sampler
        self.window_s = window_s
        self.devices = devices
        self.requested_hz: float | None = None  # the rate this monitor asked for, or joined at
        self._messages = tuple(m for m in messages if m)
        self.kernel_state = kernel_state  # whose monitor list this one is in
        self.live = live  # drawn in place in a Jupyter frontend (else text lines)
        self._cell_id = cell_id
        self._lock = threading.Lock()  # the sampler thread vs stop() from the kernel
        self._stopped = False
        self._handles: list[Any] = []
        self._drawn_at = 0.0
        self._panel: SparkPanel | None = None
        self.frames = 0  # frames sent to the frontend (tests, benchmarks)
        self._layout = -1  # the sampler's GPU layout the panel was made for
        self._paused = False  # the picture is frozen (sampling goes on)
        self.each_gpu = False  # several GPUs: each GPU's own panels shown under the overview (a button)
        self.controls: Any = None  # the Pause/Stop/window widgets (monitor_controls), once displayed

    # -- data -------------------------------------------------------------------
    @property
    def messages(self) -> tuple[str, ...]:
        """The monitor's own notes (a clamped or shared rate). Why no GPU is shown is the
        machine's statement, said once by the view (and as ``machine`` in ``to_dict``)."""
        return self._messages

    @property
    def hz(self) -> float:
        return self.sampler.hz

    @property
    def running(self) -> bool:
        return not self._stopped and self.sampler.running

    def window(self, seconds: float | None = None) -> Window:
        return self.sampler.window(seconds or self.window_s, self.devices)

    def samples(self, seconds: float | None = None) -> dict[str, list]:
        """Every buffered reading (or the last ``seconds``) as columns: ``t_s`` (seconds
        since sampling began), ``gpu<i>_<reading>_<unit>`` per shown GPU, host columns.
        Missing readings are ``None``."""
        cols = self.sampler.samples(seconds)
        if self.devices is None:
            return cols
        keep = tuple(gpu_column(d, "") for d in self.devices)
        return {k: v for k, v in cols.items() if not k.startswith("gpu") or k.startswith(keep)}

    def to_pandas(self, seconds: float | None = None) -> Any:
        """``samples()`` as a pandas DataFrame indexed by wall-clock time."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "Monitor.to_pandas() needs pandas, which is not installed: `pip install pandas`. "
                "Monitor.samples() gives the same columns as a dict of lists."
            ) from None
        cols = self.samples(seconds)
        frame = pd.DataFrame(cols)
        start = self.sampler.started_unix or time.time()
        frame.index = pd.to_datetime([start + t for t in cols["t_s"]], unit="s")
        frame.index.name = "time"
        return frame

    def holders(self) -> dict[int, list[str]]:
        """Per shown GPU, who holds its memory: notebooks when this kernel's Jupyter server
        runs gpunb's extension (asked in the background, never on the drawing path), else
        NVML's PIDs from the sampler's last process list."""
        from gpunb.analysis.holders.server import ask_server, holder_lines, pid_lines

        reading = ask_server(wait=False)
        out = {}
        for g in self.sampler.gpus:
            if self.devices is None or g.index in self.devices:
                ours = self.sampler.kernel_processes.get(g.index, ())  # this kernel and its children
                lines = (holder_lines(reading, g.index) if reading else
                         pid_lines(self.sampler.processes.get(g.index, ()), ours))
                if lines:
                    out[g.index] = lines
        return out

    def imbalance(self) -> list:
        """Findings of unbalanced GPUs over the last 30 s (one idle while others work, one
        holding far more memory); empty when balanced, with one GPU, or too soon to say."""
        return self.sampler.imbalance(self.devices)

    def text(self) -> str:
        return "\n".join([*imbalance_text(self.imbalance()), monitor_text(self.window(), self.holders())])

    def _state(self) -> str:
        return "stopped" if self._stopped else "paused" if self._paused else "live"

    @property
    def paused(self) -> bool:
        return self._paused

    def set_paused(self, paused: bool) -> None:
        """Freeze the picture (sampling goes on, ``samples()`` has every reading) or, with
        False, show the latest again. The frame says "paused at …" while frozen."""
        with self._lock:
            if self._stopped or self._paused == bool(paused):
                return
            self._paused = bool(paused)
            if self._handles:
                self._send(self._live_bundle())

    def set_window(self, window_s: float) -> None:
        """Show the last ``window_s`` seconds from now on (the data behind it is already buffered)."""
        window_s = _check_window(window_s, self.sampler.hz)
        with self._lock:
            if window_s == self.window_s:
                return
            self.window_s = window_s
            self._panel = None  # a new scale of time: drawn afresh from the buffer
            if self._handles and not self._stopped:
                self._send(self._live_bundle())

    def set_each_gpu(self, on: bool) -> None:
        """With several GPUs, show each GPU's own panels under the overview (live frames would
        shut a ``<details>`` at every redraw, so a button opens it)."""
        with self._lock:
            self.each_gpu = bool(on)
            if self._handles and not self._stopped:
                self._send(self._live_bundle())

    def html(self) -> str:
        return monitor_html(self.window(), state=self._state(), messages=self.messages, holders=self.holders(),
                            imbalance=self.imbalance())

    def to_dict(self) -> dict[str, Any]:
        w = self.window()
        latest = lambda values: next((v for v in reversed(values) if v is not None), None)  # noqa: E731
        return {
            "running": self.running,
            "state": self._state(),
            "hz": self.hz,
            "window_s": self.window_s,
            "devices": list(self.devices) if self.devices is not None else None,
            "ticks": self.sampler.ticks,
            "nvml": {"ok": w.nvml.ok, "cause": w.nvml.cause, "fix": w.nvml.fix},
            "machine": None if w.gpus else without_gpu(w.nvml, None if not w.nvml.ok else 0),
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "memory_total_mib": g.memory_total_mib,
                    "power_limit_w": g.power_limit_w,
                    "lost": g.lost,
                    "latest": {k: latest(v) for k, v in g.columns.items()},
                    "energy": None if g.energy is None else {
                        "joules": g.energy.joules, "wh": g.energy.wh, "seconds": g.energy.until_s - g.energy.since_s,
                        "source": g.energy.source},
                    "link_limits_gbs": None if g.links is None else {
                        "pcie_rx": g.links.pcie_rx.gbs, "pcie_tx": g.links.pcie_tx.gbs,
                        "nvlink": g.links.nvlink.gbs if g.links.nvlink is not None else None,
                        "measured": g.links.pcie_rx.measured},
                }
                for g in w.gpus
            ],
            "host": {k: latest(v) for k, v in w.host.items()},
            "imbalance": [{"kind": f.kind, "gpus": list(f.gpus), "text": f.text} for f in self.imbalance()],
            "notes": list(w.notes) + list(self.messages),
        }

    # -- display ----------------------------------------------------------------
    def _repr_views_(self) -> dict[str, Render]:
        # the snapshot: print(), a frontend that asks for a mimebundle, a stopped monitor
        return {"text/plain": Monitor.text, "text/html": Monitor.html}

    def __repr__(self) -> str:
        where = "all GPUs" if self.devices is None else f"GPU {', '.join(map(str, self.devices))}"
        return f"<gpunb Monitor {self._state()} {self.hz:g} Hz, last {self.window_s:g} s, {where}>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self._stopped or not self.live:
            if self.live:
                display(self._repr_mimebundle_(), raw=True)
                return
            hint = "" if self._stopped else (
                "\n(no Jupyter frontend here: sampling goes on in the background; `%gpumonitor` prints "
                "the latest line again, `.samples()` gives the data, `%gpumonitor --stop` ends it)"
            )
            display({"text/plain": self.text() + hint}, raw=True)
            return
        if self.controls is None:
            self._show_controls()
        with self._lock:
            bundle = self._live_bundle()
        handle = display(bundle, raw=True, display_id=True)
        if handle is not None:
            with self._lock:
                self._handles.append(handle)

    def _show_controls(self) -> None:
        """Pause/Stop/window above the frame (once per monitor); without ipywidgets, none."""
        from gpunb.shells.monitor_controls import MonitorControls, widgets_available

        if getattr(current_shell(), "kernel", None) is None or not widgets_available():
            return  # no Jupyter kernel (frontend="live" forced elsewhere): no frontend to click in
        try:
            self.controls = MonitorControls(self)
            self.controls.show()
        except Exception:  # a frontend without widget support must not cost the monitor
            self.controls = None

    def _live_bundle(self) -> dict[str, Any]:
        """The newest frame, drawn incrementally (only rows new since the last frame are
        formatted: this runs on the sampler thread, which holds the GIL meanwhile)."""
        sampler = self.sampler
        panel = self._panel
        if panel is None or panel.hz != sampler.hz or self._layout != sampler.layout:  # first frame, new rate or GPUs
            self._layout = sampler.layout
            panel = self._panel = SparkPanel(
                window_s=self.window_s, hz=sampler.hz, gpus=sampler.gpu_series(self.devices),
                ram_total_mib=sampler.ram_total_mib, cpu_count=sampler.cpu_count,
            )
            panel.next_index = max(0, sampler.ticks - int(self.window_s * sampler.hz) - 2 * panel.k)
        first, rows = sampler.rows_since(panel.next_index)
        panel.feed(first, rows)
        holders = self.holders()
        findings = self.imbalance()
        markup = panel_html(
            panel,
            sampler.gpu_series(self.devices),
            nvml=sampler.status,
            gpu_count=len(sampler.gpus),
            notes=panel_notes(tuple(sampler.notes), self.messages, getattr(sampler, "fake", ())),
            caption_text=caption(self._state(), hz=sampler.hz, seconds=self.window_s,
                                 started_unix=sampler.started_unix, t_last=panel.t_last),
            clock_text=clock_time(sampler.started_unix, panel.t_last),
            holders=holders,
            imbalance=findings,
            tariff=session_tariff(),
            started_unix=sampler.started_unix,
            # several GPUs: each GPU's panels are drawn only while the button shows them (cheaper);
            # without the button (no ipywidgets) in a <details>, as the stopped frame has them
            per_gpu="open" if self.each_gpu else "button" if self.controls is not None else "details",
        )
        # the text form of the newest readings only (a second's window is a few rows)
        text = monitor_text(self.window(min(self.window_s, 2.0)), holders)
        return {"text/html": markup, "text/plain": "\n".join([*imbalance_text(findings), text])}

    def _send(self, bundle: dict[str, Any]) -> None:
        """Replace the displayed output; callers hold ``self._lock`` (one writer at a time)."""
        for handle in self._handles:
            try:
                handle.update(bundle, raw=True)
            except Exception:  # no kernel any more (shutdown): nothing to update
                pass
        self.frames += 1

    def _on_tick(self, sampler: Sampler) -> None:
        """Sampler-thread listener: redraw, never print."""
        with self._lock:
            if self._stopped or self._paused or not self._handles:
                return
            now = time.monotonic()
            if now - self._drawn_at < MIN_DRAW_INTERVAL_S * 0.9:  # (0.9: a tick may come early)
                return
            self._drawn_at = now
            self._send(self._live_bundle())

    # -- life cycle ---------------------------------------------------------------
    def stop(self) -> None:
        """Stop drawing, leave the last window captioned with the time it stopped, and let
        the sampler thread end if no other monitor uses it. The data stays in ``samples()``."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.sampler.remove_listener(self._on_tick)
        if self in self.kernel_state.monitors:
            self.kernel_state.monitors.remove(self)
        if self.sampler.listener_count == 0:
            self.sampler.stop()
        else:  # the fastest rate still asked for (see ``monitor``)
            rates = [hz for m in self.kernel_state.monitors
                     if getattr(m, "sampler", None) is self.sampler and (hz := m.requested_hz)]
            if rates and max(rates) != self.sampler.hz:
                self.sampler.set_hz(max(rates))
        with self._lock:
            if self._handles:
                self._send(self._repr_mimebundle_())
        if self.controls is not None:  # they give way: a notebook saved from now on holds no widget
            self.controls.remove()

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()


# NVML time starting a monitor may take (finding the GPUs and the first reading).
START_BUDGET_S = 1.2


def _shared_rate(sampler: Sampler, monitors: list, requested: float) -> tuple[float, str]:
    """The rule for one sampler serving several monitors: it runs at the fastest rate any
    live monitor asked for, so a new monitor never slows another one down; the new one
    says when its rate is not the one it asked for, or when it sped the others up."""
    others = [getattr(m, "requested_hz", None) or sampler.hz for m in monitors
              if getattr(m, "sampler", None) is sampler]
    fastest = max(others, default=0.0)
    if fastest > requested:
        return fastest, (f"sampling at {fastest:g} Hz, not the {requested:g} Hz asked for: another monitor of "
                         f"this kernel asked for {fastest:g} Hz and one sampler serves them all (the fastest "
                         f"request wins; {requested:g} Hz comes back when that monitor stops).")
    if others and requested > sampler.hz:
        return requested, (f"the other monitors of this kernel now update at {requested:g} Hz too "
                           "(one sampler serves all).")
    return requested, ""


def monitor(
    hz: float | None = None,
    window_s: float = 120.0,
    device: int | Iterable[int] | None = None,
    *,
    frontend: str = "auto",
) -> Monitor:
    """Live GPU charts (memory split into this kernel / other processes, utilization,
    power against its limit, temperature against the slowdown threshold, SM clock,
    throttle reasons), the energy since it started, host CPU/RAM and the GPUs' PCIe and
    NVLink traffic against each link's peak, sampled ``hz`` times a second (0.5 to 10; default
    2, or the rate already running) by the kernel's one sampler thread, showing the last
    ``window_s`` seconds. ``device`` limits it to some GPUs. Several monitors share the
    sampler, which runs at the fastest rate any of them asked for.

    Display it (last line of a cell, or ``display(m)``); it keeps updating while later
    cells run. ``m.samples()`` / ``m.to_pandas()`` give the readings; ``m.stop()`` ends it
    and leaves the last frame. ``frontend`` is "auto" (charts in a Jupyter frontend, else
    text), "live" (charts updated in place; "widget" is an older name for it) or "text".
    """
    if frontend not in ("auto", "live", "widget", "text"):
        raise ValueError(f"frontend must be 'auto', 'live' or 'text', got {frontend!r}")
    requested, hz_message = clamp_hz(hz) if hz is not None else (None, "")
    shell = current_shell()
    state = kernel_state(shell)
    sampler = state.sampler
    monitors = state.monitors
    from gpunb.readings.nvml import default_session

    nvml = sampler.nvml if sampler is not None else default_session()
    with nvml.budget(START_BUDGET_S, "starting the monitor"):  # a hung NVML costs this cell little
        if sampler is None:
            sampler = state.sampler = Sampler(nvml, hz=requested or HZ_DEFAULT)
        rate_message = ""
        if requested is not None:
            rate, rate_message = _shared_rate(sampler, monitors, requested)
            sampler.set_hz(rate)
        window_s = _check_window(window_s, sampler.hz)
        devices = _check_devices(device, sampler)
        live = _jupyter_frontend(shell) if frontend == "auto" else frontend in ("live", "widget")
        cell = _cell_run(shell)
        m = Monitor(
            sampler, state, window_s=window_s, devices=devices, live=live,
            messages=[hz_message, rate_message], cell_id=cell,
        )
        m.requested_hz = requested if requested is not None else sampler.hz  # without hz: the rate it joined at
        replaced = [
            old for old in monitors
            if isinstance(old, Monitor) and cell is not None and old._cell_id is not None
            and old._cell_id[0] == cell[0] and old._cell_id[1] != cell[1]
        ]
        monitors.append(m)
        sampler.add_listener(m._on_tick)
        if sampler.ticks == 0:
            sampler.tick()  # something to show at once; the thread takes over from here
    sampler.start()
    for old in replaced:  # the same cell run again: its old output is gone
        old.stop()
    return m
