"""The running cell's number as IPython shows it (``In [n]``), on IPython 8 and 9.

``shell.execution_count`` is not it on both: IPython 8 adds one *after* a stored cell
ran, IPython 9 adds one *before* the cell runs, so during a cell it reads n on 8 and
n + 1 on 9. Both versions write the running cell's number on the cell's
``ExecutionResult`` (``result.execution_count``) before the cell runs and hand that
result to the display hook (``shell.displayhook.exec_result``) while it executes;
ipykernel publishes the same number as ``In [n]`` (``execute_input``). That result is
the source here.
"""

from __future__ import annotations

from typing import Any


def running_cell_number(shell: Any) -> int | None:
    """``n`` of the cell now running (its ``In [n]``), the number IPython names its code by."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(result, "execution_count", None)
    if isinstance(number, int):
        return number
    # No cell running (a magic called from Python), or a cell kept out of the history
    # (IPython 8 leaves its number None): IPython then compiles the code under
    # shell.execution_count, so tracebacks name it that way; use the same.
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None
