"""A Cancel button beside a long magic's progress (``%gpucheck``, ``%gpufit``).

A click does what ``Kernel → Interrupt`` does to this process: it sends SIGINT, which the
kernel turns into ``KeyboardInterrupt`` in the running cell, so the magic's own clean-up runs
exactly as after Ctrl-C (``%gpucheck`` stops its waiting). The click is
handled on a kernel subshell (:mod:`gpunb.shells.widget_channel`) because the magic holds the
main thread; where subshells are not available the button cannot act while the magic runs,
so it is not shown. It only ever interrupts the magic it belongs to: once the magic has
ended, a late click does nothing. Like the monitor's controls, the button's output is marked
so that gpunb's save hook keeps it out of saved notebooks, and it gives way to nothing when
the magic ends.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from gpunb.shells.save_hook import CONTROLS_MARK


class CancelButton:
    def __init__(self, what: str) -> None:
        import ipywidgets as w

        self.button = w.Button(description="Cancel", icon="times", tooltip=f"Stop {what} (like Kernel → Interrupt)",
                               layout=w.Layout(width="96px"))
        self.button.add_class("gpunb-cancel")
        self.button.on_click(self._click)
        self._lock = threading.Lock()
        self._running = True
        self._handle: Any = None
        self.cancelled = False

    @classmethod
    def shown(cls, what: str, shell: Any) -> CancelButton | None:
        """A Cancel button displayed for ``what``, or None where it could not act (no Jupyter
        kernel, no ipywidgets, no subshell to receive the click while the magic runs)."""
        kernel = getattr(shell, "kernel", None)
        if kernel is None:
            return None
        from gpunb.shells.monitor_controls import widgets_available
        from gpunb.shells.widget_channel import controls_subshell, route_clicks

        if not widgets_available() or controls_subshell(kernel) is None:
            return None
        try:
            from IPython.display import display

            button = cls(what)
            bundle = dict(button.button._repr_mimebundle_())
            bundle["text/plain"] = f"Cancel {what}"
            button._handle = display(bundle, raw=True, display_id=True, metadata={CONTROLS_MARK: True})
            if not route_clicks([button.button], kernel):
                button.done()
                return None
            return button
        except Exception:  # a frontend without widgets must not cost the magic
            return None

    def _click(self, _button: Any) -> None:
        with self._lock:
            if not self._running or self.cancelled:
                return
            self.cancelled = True
            self.button.description, self.button.disabled = "Cancelling…", True
            os.kill(os.getpid(), signal.SIGINT)  # what Kernel → Interrupt sends (to this process only)

    def done(self) -> None:
        """The magic ended: no click interrupts anything from now on; the button gives way."""
        with self._lock:
            self._running = False
        handle, self._handle = self._handle, None
        try:
            if handle is not None:
                handle.update({"text/plain": ""}, raw=True, metadata={})
        except Exception:  # the kernel is going away: nothing left to update
            pass
        from gpunb.shells.monitor_controls import close_widgets

        close_widgets(self.button)
