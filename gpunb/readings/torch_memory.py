"""What PyTorch's CUDA caching allocator says, read only when it is safe and cheap.

Never imports torch: the caller passes the module, or it is taken from ``sys.modules``
when the user already imported it. Never creates a CUDA context: device readings are
taken only when ``torch.cuda.is_initialized()`` is already true.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


def imported_torch() -> Any:
    """The torch module if the user imported it, else ``None`` (never imports it)."""
    return sys.modules.get("torch")


def cuda_initialized(torch: Any) -> bool:
    """True when this process already has a CUDA context through torch."""
    if torch is None:
        return False
    try:
        # is_initialized only: is_available() would cuInit the driver in this process, which
        # breaks fork-based launchers even without a context (torch's own note on it).
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


@dataclass(frozen=True)
class TorchDeviceMemory:
    """Allocator state of one CUDA device (bytes)."""

    index: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    inactive_split_bytes: int  # cached, split blocks: what fragmentation strands
    free_bytes: int | None  # cudaMemGetInfo: free on the device (all processes)
    total_bytes: int | None
    num_ooms: int = 0
    num_alloc_retries: int = 0

    @property
    def reserved_unallocated_bytes(self) -> int:
        return max(0, self.reserved_bytes - self.allocated_bytes)

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "inactive_split_bytes": self.inactive_split_bytes,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "num_ooms": self.num_ooms,
            "num_alloc_retries": self.num_alloc_retries,
        }


def from_stats(index: int, stats: dict, free_bytes: int | None = None, total_bytes: int | None = None) -> TorchDeviceMemory:
    """Build the record from a ``torch.cuda.memory_stats()`` dict (live or recorded)."""
    g = lambda key: int(stats.get(key, 0) or 0)  # noqa: E731
    return TorchDeviceMemory(
        index=index,
        allocated_bytes=g("allocated_bytes.all.current"),
        reserved_bytes=g("reserved_bytes.all.current"),
        peak_allocated_bytes=g("allocated_bytes.all.peak"),
        peak_reserved_bytes=g("reserved_bytes.all.peak"),
        inactive_split_bytes=g("inactive_split_bytes.all.current"),
        free_bytes=free_bytes,
        total_bytes=total_bytes,
        num_ooms=g("num_ooms"),
        num_alloc_retries=g("num_alloc_retries"),
    )


def read_device(torch: Any, index: int) -> TorchDeviceMemory | None:
    """One device's allocator state, or ``None`` when CUDA is not initialized."""
    if not cuda_initialized(torch):
        return None
    try:
        stats = torch.cuda.memory_stats(index)
    except Exception:
        return None
    free = total = None
    try:
        free, total = torch.cuda.mem_get_info(index)
    except Exception:  # a sticky CUDA error makes this raise; the stats still stand
        pass
    return from_stats(index, stats, free, total)


def read_all(torch: Any = None) -> tuple[TorchDeviceMemory, ...]:
    """Every CUDA device torch sees, if the user's kernel already uses CUDA."""
    torch = torch if torch is not None else imported_torch()
    if not cuda_initialized(torch):
        return ()
    try:
        n = torch.cuda.device_count()
    except Exception:
        return ()
    out = [read_device(torch, i) for i in range(n)]
    return tuple(r for r in out if r is not None)


def per_process_limit_bytes(torch: Any, index: int, total_bytes: int) -> int | None:
    """The cap set by ``torch.cuda.set_per_process_memory_fraction`` (None if unset/unknown)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is None:
        return None
    try:
        fraction = float(getter(index))
    except Exception:
        return None
    if fraction >= 1.0:
        return None
    return int(fraction * total_bytes)
