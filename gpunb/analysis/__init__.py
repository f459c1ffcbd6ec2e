"""The middle layer: what the readings mean. One subpackage per capability (``checks``,
``steps``, ``ranks``, ``profile``, ``memory``, ``fit``, ``holders``, ``monitor``), each saying in
its ``__init__`` what it owns and may use; ``advice``, ``gpu_specs`` and ``torch_wheels`` are
shared by all. The allowed imports between capabilities are written in
``tests/import_rules.py`` (``CAPABILITY_USES``) and drawn in ``docs/architecture.md``.

Until 0.3 the modules' old flat paths (``gpunb.analysis.tensor_census``, ...) still import,
with a ``DeprecationWarning`` naming the new path (CHANGELOG, 0.2.0).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

# old flat module -> its new home (0.2.0). Three old names are now packages (checks, profile,
# ranks): their old attributes are served by the package's __getattr__ (moved_attribute).
MOVED_MODULES = {
    "check_inputs": "checks.inputs", "check_report": "checks.records", "checks_gpu": "checks.gpu",
    "checks_host": "checks.host", "checks_multi_gpu": "checks.multi_gpu", "checks_torch": "checks.pytorch",
    "instruments": "steps.instruments", "step_events": "steps.events", "step_plan": "steps.plan",
    "flop_count": "steps.flop_count", "op_trace": "steps.op_trace", "throughput_records": "steps.records",
    "rank_channel": "ranks.channel", "rank_recorder": "ranks.recorder", "rank_records": "ranks.records",
    "profile_records": "profile.records", "profile_history": "profile.history", "verdict": "profile.verdict",
    "cell_meter": "profile.meter", "throughput": "profile.throughput",
    "memory_report": "memory.report", "memory_records": "memory.records", "tensor_census": "memory.census",
    "release": "memory.release", "oom": "memory.oom", "oom_message": "memory.oom_message",
    "oom_records": "memory.oom_records",
    "batch_fit": "fit.search", "batch_fit_records": "fit.records", "fit_trial": "fit.trial",
    "fresh_state": "fit.fresh_state", "gpu_holders": "holders.gpus", "server_holders": "holders.server",
    "sampler": "monitor.sampler", "imbalance": "monitor.imbalance",
}


def _warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in gpunb 0.2; the old path goes in 0.3", DeprecationWarning, stacklevel=3)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old flat path as the module at its new path (one object under both names)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        head, _, tail = fullname.rpartition(".")
        if head != __name__ or tail not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = f"{__name__}.{MOVED_MODULES[spec.name.rpartition('.')[2]]}"
        _warn_moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module already ran


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def moved_attribute(package: str, name: str, old_module: str) -> Any:
    """An attribute the old flat module ``package`` had, now in ``old_module``'s new home; for a
    capability package's ``__getattr__``."""
    if name.startswith("_"):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(old_module)
    if not hasattr(module, name):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(module, name)
    home = getattr(value, "__module__", None) or old_module
    _warn_moved(f"{package}.{name}", f"{home}.{name}" if home.startswith(__name__) else f"{old_module}.{name}")
    setattr(sys.modules[package], name, value)  # warned once; ``from ... import`` looks twice
    return value
