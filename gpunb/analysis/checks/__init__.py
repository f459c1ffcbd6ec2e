"""`%gpucheck` / `gpunb.check()`: the setup checklist, one pure function per check over inputs
gathered once (`inputs`), the records (`records`) and the runner (`checklist`).

Uses `readings` and the shared analysis modules (`advice`, `gpu_specs`, `torch_wheels`); no other capability."""

from typing import Any

from gpunb.analysis import moved_attribute


def __getattr__(name: str) -> Any:
    # gpunb.analysis.checks was one module until 0.2: its names still resolve, with a warning
    return moved_attribute(__name__, name, "gpunb.analysis.checks.checklist")
