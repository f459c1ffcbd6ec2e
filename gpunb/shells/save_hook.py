"""What gpunb's Jupyter server extension does to a notebook as it is saved: the live
monitor's controls are left out of the file.

The controls (Pause, Stop, time window; :mod:`gpunb.shells.monitor_controls`) are an
ipywidgets output: saved while the monitor runs, it would reopen as "Error displaying
widget: model not found", because the widget lived in the kernel that is gone. The monitor's
frame is a separate plain HTML output and stays. Only outputs gpunb marked are touched; the
notebook open in the browser keeps its controls (the hook changes the file, not the page).
"""

from __future__ import annotations

from typing import Any

# The same mark monitor_controls puts in the output's metadata (kept here too so that the
# server, which never runs a monitor, does not import the kernel side).
CONTROLS_MARK = "gpunb_live_controls"


def _is_live_controls(output: Any) -> bool:
    return isinstance(output, dict) and isinstance(output.get("metadata"), dict) and bool(
        output["metadata"].get(CONTROLS_MARK))


def drop_live_controls(model: dict[str, Any] | None = None, **_: Any) -> None:
    """A ``pre_save_hook`` (``ContentsManager.register_pre_save_hook``): remove gpunb's live
    controls from every code cell of a notebook model; any other file is left alone."""
    if not isinstance(model, dict) or model.get("type") != "notebook":
        return
    content = model.get("content")
    cells = content.get("cells") if isinstance(content, dict) else None
    if not isinstance(cells, list):
        return
    for cell in cells:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        if isinstance(outputs, list) and any(_is_live_controls(o) for o in outputs):
            cell["outputs"] = [o for o in outputs if not _is_live_controls(o)]
