"""The one place that finds the running IPython shell and shows things in it.

The analysis layer never looks for a shell: what it needs from one (the notebook's
namespace, a progress callback, whether it runs in a kernel) is passed in by the magics
and by the API twins in :mod:`gpunb.shells.api`, which get it from here.
"""

from __future__ import annotations

import sys
from typing import Any


def current_shell() -> Any:
    """The running IPython shell, or None in plain Python. Never imports IPython just to
    find out there is none (``import gpunb`` stays cheap)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def display_or_print(obj: Any) -> None:
    """Display ``obj`` in IPython/Jupyter (its rich bundle); print its text view elsewhere."""
    if current_shell() is None:
        print(obj)
        return
    from IPython.display import display

    display(obj)


class ProgressLine:
    """Progress as one line of text: updated in place in IPython/Jupyter (a display id),
    printed line by line elsewhere. Nothing is shown before the first message."""

    def __init__(self, prefix: str, shell: Any = None) -> None:
        self.prefix = prefix
        self._shell = shell if shell is not None else current_shell()
        self._handle: Any = None

    def __call__(self, text: str) -> None:
        bundle = {"text/plain": self.prefix + text}
        if self._shell is None:
            print(bundle["text/plain"], flush=True)
            return
        from IPython.display import display

        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
