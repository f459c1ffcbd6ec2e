"""gpunb: a Jupyter notebook as the best place to train on an NVIDIA GPU.

``%load_ext gpunb`` registers the magics. ``import gpunb`` is cheap: it imports no torch,
no pynvml and no IPython; every public function is loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gpunb._version import __version__

# Public API name -> "module:attribute", imported on first access.
_LAZY = {
    "check": "gpunb.analysis.checks:check",
    "monitor": "gpunb.shells.monitor:monitor",
    "profile": "gpunb.shells.profile_api:profile",
    "memory": "gpunb.analysis.memory_report:memory",
    "diagnose_oom": "gpunb.shells.oom_hook:diagnose_oom",
    "fit_batch_size": "gpunb.analysis.batch_fit:fit_batch_size",
}

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


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


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpunb``: register magics and cell hooks (no torch, no CUDA context)."""
    from gpunb.shells.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpunb``: undo everything ``load`` did, stop every thread."""
    from gpunb.shells.extension import unload

    unload(ipython)
