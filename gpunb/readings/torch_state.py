"""Allocator and device facts from the user's torch, read only when torch is already imported.

Nothing here imports torch: callers pass the module from ``sys.modules`` (see
:func:`imported_torch`), so gpunb never pays torch's import cost or creates a CUDA context
on its own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


def imported_torch() -> Any | None:
    """The ``torch`` module if the user imported it, else None (never imports it)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "cuda") else None


def cuda_initialized(torch: Any | None) -> bool:
    """True when this process already holds a CUDA context (no context is created here)."""
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a broken build or a bad fork: treat as no CUDA
        return False


@dataclass(frozen=True)
class AllocatorStats:
    """torch's caching-allocator counters for one device (bytes)."""

    device: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    alloc_retries: int  # failed cudaMalloc calls that flushed the cache and retried
    ooms: int


def read_allocator(torch: Any, device: int) -> AllocatorStats:
    """torch's counters from the allocator's nested stats (12-20 µs on the H200); the public
    ``memory_stats()`` flattens and sorts every counter in Python first (85-160 µs,
    benchmarks/profile_overhead.py), so it is only the fallback for another torch layout."""
    nested = getattr(torch._C, "_cuda_memoryStats", None)
    if nested is not None:
        try:
            s = nested(device)
            alloc, res = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
            return AllocatorStats(device, int(alloc["current"]), int(res["current"]), int(alloc["peak"]),
                                  int(res["peak"]), int(s.get("num_alloc_retries", 0)), int(s.get("num_ooms", 0)))
        except (KeyError, TypeError):
            pass
    s = torch.cuda.memory_stats(device)
    return AllocatorStats(
        device=device,
        allocated_bytes=int(s.get("allocated_bytes.all.current", 0)),
        reserved_bytes=int(s.get("reserved_bytes.all.current", 0)),
        peak_allocated_bytes=int(s.get("allocated_bytes.all.peak", 0)),
        peak_reserved_bytes=int(s.get("reserved_bytes.all.peak", 0)),
        alloc_retries=int(s.get("num_alloc_retries", 0)),
        ooms=int(s.get("num_ooms", 0)),
    )


def current_device(torch: Any) -> int:
    return int(torch.cuda.current_device())


def device_uuid(torch: Any, device: int) -> str | None:
    """The device's UUID as NVML spells it ("GPU-..."), to match NVML and CUDA devices."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:
        return None
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def matmul_precision(torch: Any) -> str:
    """"highest" means fp32 matmuls do not use TF32 tensor cores."""
    try:
        return str(torch.get_float32_matmul_precision())
    except Exception:
        return "unknown"
