"""The records of ``%gpumem`` / ``gpunb.memory()``, filled by :mod:`gpunb.analysis.memory.report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpunb.analysis.memory.census import Census
from gpunb.analysis.memory.release import MemoryPoint
from gpunb.display import DisplayMixin


@dataclass(frozen=True)
class GpuMemoryRow:
    index: int  # torch device index (NVML's index when this kernel has no CUDA)
    name: str
    total_bytes: int | None
    used_bytes: int | None  # NVML, all processes
    process_bytes: int | None  # NVML, this kernel's process
    torch_allocated_bytes: int | None
    torch_reserved_bytes: int | None
    other_processes_bytes: int | None  # NVML, processes that are not this kernel's (nor its children)
    nvml_index: int | None = None
    child_processes_bytes: int | None = None  # NVML, this kernel's child processes (workers, ranks)
    process_match: str = ""  # how NVML's processes were matched to this kernel (readings.devices.OWN_*)

    @property
    def non_torch_bytes(self) -> int | None:
        if self.process_bytes is None or self.torch_reserved_bytes is None:
            return None
        return max(0, self.process_bytes - self.torch_reserved_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "total_bytes": self.total_bytes, "used_bytes": self.used_bytes,
            "process_bytes": self.process_bytes, "torch_allocated_bytes": self.torch_allocated_bytes,
            "torch_reserved_bytes": self.torch_reserved_bytes, "other_processes_bytes": self.other_processes_bytes,
            "non_torch_bytes": self.non_torch_bytes, "nvml_index": self.nvml_index,
            "child_processes_bytes": self.child_processes_bytes, "process_match": self.process_match,
        }


@dataclass(frozen=True)
class FreedVariables:
    names: tuple[str, ...]
    missing: tuple[str, ...]
    before: MemoryPoint
    after: MemoryPoint
    freed_tensor_bytes: int  # census before minus after (works on CPU too)

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "missing": list(self.missing), "before": self.before.to_dict(),
                "after": self.after.to_dict(), "freed_tensor_bytes": self.freed_tensor_bytes}


@dataclass
class MemoryReport(DisplayMixin):
    """What ``%gpumem`` / ``gpunb.memory()`` found: per-GPU rows, the live tensors, what is missing."""

    gpus: tuple[GpuMemoryRow, ...]
    census: Census | None
    problems: list[str] = field(default_factory=list)  # what is missing, with the fix
    freed: FreedVariables | None = None
    top: int = 20
    devices_shown: str = "cuda"
