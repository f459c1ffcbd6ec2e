"""Multi-GPU profiled cells: the kernel opens a channel (`channel`), each worker process records its
steps (`recorder`, started by `boot/sitecustomize.py`), and `summary` puts the ranks side by side.

Uses `steps` (the same hooks in every rank) and `readings`; it never judges a cell (that is `profile`)."""

from typing import Any

from gpunb.analysis import moved_attribute


def __getattr__(name: str) -> Any:
    # gpunb.analysis.ranks was one module until 0.2: its names still resolve, with a warning
    return moved_attribute(__name__, name, "gpunb.analysis.ranks.summary")
