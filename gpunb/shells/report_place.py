"""A report's place at the top of its cell, kept while the cell runs.

``%%gpuprofile``'s verdict is known only when the cell ends; appended then, it lands below
everything the cell printed (3,282 px below the code for a cell that prints every step). So
the place is taken when the cell starts: a display with a ``display_id`` that says the cell is
running, updated in place with the report at the end. JupyterLab, Notebook 7, VS Code and
nbclient (nbconvert, CI) all update a display by its id, and the saved notebook keeps the
final report there. Terminal IPython prints as it goes and cannot update what it printed:
there the report is printed at the end, as before.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any


class Running:
    """What the reserved place says until the report arrives."""

    def __init__(self, what: str) -> None:
        self.text = f"{what}: running since {time.strftime('%H:%M:%S')} — the verdict shows here when the cell ends"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        html = (f'<div class="gpunb-running" style="opacity:0.72;font-family:var(--jp-ui-font-family,sans-serif);'
                f'font-size:13px">⏳ {escape(self.text)}</div>')
        return {"text/plain": self.text, "text/html": html}


class ReportPlace:
    """Reserve the top of the cell's output (in a Jupyter kernel), then fill it with the report."""

    def __init__(self, shell: Any, what: str) -> None:
        self._handle = None
        if getattr(shell, "kernel", None) is None:  # terminal IPython: nothing to update in place
            return
        from IPython.display import display

        try:
            self._handle = display(Running(what), display_id=True)
        except Exception:  # a frontend that cannot take it: the report comes at the end instead
            self._handle = None

    @property
    def reserved(self) -> bool:
        """A place was kept at the top of the cell (a Jupyter kernel)."""
        return self._handle is not None

    def fill(self, report: Any) -> None:
        """Show ``report`` in the reserved place, or below the cell's output where none was kept."""
        from IPython.display import display

        if self._handle is None:
            display(report)
            return
        self._handle.update(report)
        self._handle = None

    def clear(self) -> None:
        """Nothing to report: the reserved place says nothing."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
            self._handle = None
