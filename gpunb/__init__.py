"""gpunb: a Jupyter notebook as the best place to train on an NVIDIA GPU.

``%load_ext gpunb`` registers the magics. ``import gpunb`` is cheap: it imports no torch,
no pynvml and no IPython; every public function is loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gpunb import analysis, display  # noqa: F401  (analysis: the old module paths' finder, until 0.3)
from gpunb._version import __version__

# Public API name -> "module:attribute", imported on first access. The API twins of the
# magics live in the shells layer: they find the shell and display; analysis only measures.
_LAZY = {
    "check": "gpunb.shells.api:check",
    "monitor": "gpunb.shells.monitor:monitor",
    "profile": "gpunb.shells.api:profile",
    "memory": "gpunb.shells.api:memory",
    "diagnose_oom": "gpunb.shells.api:diagnose_oom",
    "fit_batch_size": "gpunb.shells.api:fit_batch_size",
    "plan": "gpunb.shells.api:plan",
    "energy": "gpunb.shells.api:energy",
    "trace_memory": "gpunb.shells.trace_api:trace_memory",
}

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def _load_views() -> None:
    """Register how every record shows: run the first time a record is displayed."""
    import gpunb.views  # noqa: F401


display.add_view_loader(_load_views)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gpunb' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter server extension (enabled by the installed
    ``jupyter_server_config.d/gpunb.json``); its module is imported only by a server."""
    return [{"module": "gpunb.shells.server_extension"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpunb``: register magics and cell hooks (no torch, no CUDA context)."""
    from gpunb.shells.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpunb``: undo everything ``load`` did, stop every thread."""
    from gpunb.shells.extension import unload

    unload(ipython)
