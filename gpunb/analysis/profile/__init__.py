"""`%%gpuprofile` / `gpunb.profile()`: one measured cell (`cell`), its records, the verdict and its
advice, throughput against the hardware, the one-line meter and the history of profiled cells, and
the cell's energy and link traffic (`cell_energy`, `link_verdict`); what it reads from NVML on the
worker (`nvml_end`).

Uses `steps`, `ranks`, `energy` and the shared modules (`advice`, `gpu_specs`, `torch_wheels`); never
memory or fit."""

from typing import Any

from gpunb.analysis import moved_attribute


def __getattr__(name: str) -> Any:
    # gpunb.analysis.profile was one module until 0.2: its names still resolve, with a warning
    return moved_attribute(__name__, name, "gpunb.analysis.profile.cell")
