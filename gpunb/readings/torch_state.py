"""What the user's torch says about CUDA in this process: the one torch-state reader.

Nothing here imports torch: callers pass the module, found in ``sys.modules`` by
:func:`imported_torch`, so gpunb never pays torch's import cost. Nothing here starts CUDA
or poisons fork-based launchers: every device reading is taken only after
:func:`cuda_initialized` says torch already has CUDA up in this process (then a device's
properties, counters and free memory are safe to read). Before that, facts come from NVML,
``torch/version.py`` (``torch_build.py``) or the subprocess probe (``cuda_probe.py``).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard


def imported_torch() -> Any | None:
    """The ``torch`` module if the user imported it, else None (never imports it)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "cuda") else None


def cuda_initialized(torch: Any | None) -> TypeGuard[Any]:
    """True when torch already has CUDA initialized in this process (nothing is started here);
    where it is True, ``torch`` is the module (for the type checker: not None).

    ``is_initialized`` only: ``is_available()`` and ``device_count()`` may ask the CUDA
    runtime, which marks the process as unable to fork (torch/csrc/cuda/Module.cpp calls
    ``poison_fork()`` in the getters behind them)."""
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a broken build or a bad fork: treat as no CUDA
        return False


@dataclass(frozen=True)
class AllocatorStats:
    """torch's caching-allocator counters for one CUDA device (bytes); ``free_bytes`` and
    ``total_bytes`` (cudaMemGetInfo, all processes) only from :func:`read_device_memory`."""

    device: int  # torch's index (cuda:N)
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    inactive_split_bytes: int = 0  # cached, split blocks: what fragmentation strands
    alloc_retries: int = 0  # failed cudaMalloc calls that flushed the cache and retried
    ooms: int = 0
    free_bytes: int | None = None
    total_bytes: int | None = None

    @property
    def reserved_unallocated_bytes(self) -> int:
        return max(0, self.reserved_bytes - self.allocated_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def allocator_from_stats(device: int, stats: dict[str, Any], free_bytes: int | None = None,
                         total_bytes: int | None = None) -> AllocatorStats:
    """The record from a flat ``torch.cuda.memory_stats()`` dict (live or recorded)."""
    def g(key: str) -> int:
        return int(stats.get(key, 0) or 0)

    return AllocatorStats(
        device=device,
        allocated_bytes=g("allocated_bytes.all.current"),
        reserved_bytes=g("reserved_bytes.all.current"),
        peak_allocated_bytes=g("allocated_bytes.all.peak"),
        peak_reserved_bytes=g("reserved_bytes.all.peak"),
        inactive_split_bytes=g("inactive_split_bytes.all.current"),
        alloc_retries=g("num_alloc_retries"),
        ooms=g("num_ooms"),
        free_bytes=free_bytes,
        total_bytes=total_bytes,
    )


def read_allocator(torch: Any, device: int) -> AllocatorStats:
    """torch's counters from the allocator's nested stats (12-20 µs on the H200); the public
    ``memory_stats()`` flattens and sorts every counter in Python first (85-160 µs,
    benchmarks/profile_overhead.py), so it is only the fallback for another torch layout.
    The profiler's hot path: call it only once :func:`cuda_initialized` is true."""
    nested = getattr(torch._C, "_cuda_memoryStats", None)
    if nested is not None:
        try:
            s = nested(device)
            alloc, res = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
            split = s.get("inactive_split_bytes", {}).get("all", {}).get("current", 0)
            return AllocatorStats(device, int(alloc["current"]), int(res["current"]), int(alloc["peak"]),
                                  int(res["peak"]), int(split), int(s.get("num_alloc_retries", 0)),
                                  int(s.get("num_ooms", 0)))
        except (KeyError, TypeError, AttributeError):
            pass
    return allocator_from_stats(device, torch.cuda.memory_stats(device))


def read_device_memory(torch: Any, device: int) -> AllocatorStats | None:
    """The allocator's counters plus the device's free and total memory; None when torch has
    not initialized CUDA (nothing is started to answer) or cannot read the device."""
    if not cuda_initialized(torch):
        return None
    try:
        stats = read_allocator(torch, device)
    except Exception:
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
    except Exception:  # a sticky CUDA error makes this raise; the counters still stand
        return stats
    return AllocatorStats(**{**asdict(stats), "free_bytes": int(free), "total_bytes": int(total)})


def reserved_bytes(torch: Any, device: int) -> int | None:
    """What torch's allocator holds on ``cuda:device`` now; None without CUDA in this process."""
    if not cuda_initialized(torch):
        return None
    try:
        return read_allocator(torch, device).reserved_bytes
    except Exception:
        return None


def current_device(torch: Any) -> int:
    """torch's current device; call only once CUDA is initialized (it would start CUDA otherwise)."""
    return int(torch.cuda.current_device())


def device_count(torch: Any) -> int:
    """The CUDA devices torch sees; 0 unless CUDA is already initialized (before that, the count
    may come from the CUDA runtime, which poisons fork)."""
    if not cuda_initialized(torch):
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def device_uuid(torch: Any, device: int) -> str | None:
    """The device's UUID as torch prints it (bare hex groups; a GPU's or, on a MIG slice, the
    instance's), to match with NVML's ``GPU-``/``MIG-`` UUIDs by
    :func:`gpunb.readings.devices.uuid_key`. None before CUDA is initialized (device
    properties would initialize it)."""
    if not cuda_initialized(torch):
        return None
    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:
        return None
    return str(uuid) if uuid is not None else None


def per_process_limit_bytes(torch: Any, device: int, total_bytes: int) -> int | None:
    """The cap set by ``torch.cuda.set_per_process_memory_fraction`` (None if unset/unknown)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is None:
        return None
    try:
        fraction = float(getter(device))
    except Exception:
        return None
    if fraction >= 1.0:
        return None
    return int(fraction * total_bytes)


def matmul_precision(torch: Any) -> str:
    """"highest" means fp32 matmuls do not use TF32 tensor cores."""
    try:
        return str(torch.get_float32_matmul_precision())
    except Exception:
        return "unknown"
