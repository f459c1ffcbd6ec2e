"""``with gpunb.trace_memory() as t:``: the API twin of ``%%gpumem --trace``."""

from __future__ import annotations

from typing import Any, Literal

from gpunb.analysis.memory.alloc_records import MemoryTrace
from gpunb.shells.api import ResultBlock
from gpunb.shells.session import current_shell, display_or_print


class trace_memory(ResultBlock):  # noqa: N801  (used like a function: `with gpunb.trace_memory():`)
    """Record the CUDA allocations of a block with torch's allocation history and explain them:
    the lines of your code that made the peak, memory by role over the block (parameters,
    gradients, optimizer state, activations, temporaries) with the peak marked, what was alive
    at the peak. The history is on only inside the block (put back as it was after); torch's
    peak counter is reset at the start, as ``%%gpuprofile`` does.

    After the block ``t.result`` is the :class:`~gpunb.analysis.memory.alloc_records.MemoryTrace`
    (``t`` displays it; ``t.to_dict()`` gives plain data). Options: ``save`` (a new file for
    torch's raw snapshot, for https://pytorch.org/memory_viz), ``max_entries`` (events kept),
    ``show`` (display the result when the block ends; default: in IPython/Jupyter), ``label``.
    An exception in the block propagates unchanged. Without CUDA (or torch) the block runs and
    the result says why nothing was recorded.
    """

    NOT_FINISHED = "gpunb.trace_memory: not finished yet (use it as `with gpunb.trace_memory() as t:`)"

    def __init__(self, label: str = "", *, save: str | None = None, max_entries: int | None = None,
                 show: bool | None = None, namespace: dict[str, Any] | None = None) -> None:
        from gpunb.readings.alloc_history import CELL_MAX_ENTRIES

        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__}")
        if max_entries is not None and (not isinstance(max_entries, int) or max_entries < 100):
            raise ValueError(f"max_entries must be a whole number of at least 100, got {max_entries!r}")
        self.label = label
        self.save = save
        self.max_entries = max_entries or CELL_MAX_ENTRIES
        self.show = show
        self.namespace = namespace
        self.result: MemoryTrace | None = None
        self._session: Any = None

    def __enter__(self) -> trace_memory:
        from gpunb.analysis.memory.alloc_sites import shell_cell_numbers
        from gpunb.analysis.memory.alloc_trace import TraceSession
        from gpunb.readings.torch_state import imported_torch

        shell = current_shell()
        namespace = self.namespace if self.namespace is not None else (shell.user_ns if shell is not None else {})
        self._session = TraceSession(
            torch=imported_torch(), namespace=namespace,
            cell_numbers=lambda: shell_cell_numbers(getattr(shell, "compile", None)),
            label=self.label, save_path=self.save, max_entries=self.max_entries)
        self._session.start()
        return self

    def __exit__(self, etype: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        self.result = self._session.stop(exc)
        if self.show if self.show is not None else current_shell() is not None:
            display_or_print(self.result)
        return False  # never swallow the user's exception
