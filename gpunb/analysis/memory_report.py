"""``gpunb.memory()`` / ``%gpumem``: where VRAM went, right now.

Per GPU: NVML's used memory, this process (NVML per-process), torch allocated and reserved,
and the rest of this process (CUDA context, cuDNN/cuBLAS workspaces, other libraries).
Then the live tensors by notebook name, and leftovers (output history, old exceptions).
``free`` deletes named variables first and reports what came back.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpunb.analysis.release import MemoryPoint, measure
from gpunb.analysis.tensor_census import Census, take_census


NVML_BUDGET_S = 1.0


@dataclass(frozen=True)
class GpuMemoryRow:
    index: int  # torch device index
    name: str
    total_bytes: int | None
    used_bytes: int | None  # NVML, all processes
    process_bytes: int | None  # NVML, this kernel
    torch_allocated_bytes: int | None
    torch_reserved_bytes: int | None
    other_processes_bytes: int | None

    @property
    def non_torch_bytes(self) -> int | None:
        if self.process_bytes is None or self.torch_reserved_bytes is None:
            return None
        return max(0, self.process_bytes - self.torch_reserved_bytes)

    def to_dict(self) -> dict:
        return {
            "index": self.index, "name": self.name, "total_bytes": self.total_bytes, "used_bytes": self.used_bytes,
            "process_bytes": self.process_bytes, "torch_allocated_bytes": self.torch_allocated_bytes,
            "torch_reserved_bytes": self.torch_reserved_bytes, "other_processes_bytes": self.other_processes_bytes,
            "non_torch_bytes": self.non_torch_bytes,
        }


@dataclass(frozen=True)
class FreedVariables:
    names: tuple[str, ...]
    missing: tuple[str, ...]
    before: MemoryPoint
    after: MemoryPoint
    freed_tensor_bytes: int  # census before minus after (works on CPU too)

    def to_dict(self) -> dict:
        return {"names": list(self.names), "missing": list(self.missing), "before": self.before.to_dict(),
                "after": self.after.to_dict(), "freed_tensor_bytes": self.freed_tensor_bytes}


@dataclass
class MemoryReport:
    gpus: tuple[GpuMemoryRow, ...]
    census: Census | None
    problems: list[str] = field(default_factory=list)  # what is missing, with the fix
    freed: FreedVariables | None = None
    top: int = 20
    devices_shown: str = "cuda"

    def to_dict(self) -> dict:
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "census": self.census.to_dict() if self.census else None,
            "problems": list(self.problems),
            "freed": self.freed.to_dict() if self.freed else None,
            "devices_shown": self.devices_shown,
        }

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from gpunb.views.memory_view import memory_html, memory_text

        return {"text/plain": memory_text(self), "text/html": memory_html(self)}

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        from gpunb.views.memory_view import memory_text

        p.text(memory_text(self))


def _gpu_rows(torch: Any, nvml: Any) -> tuple[tuple[GpuMemoryRow, ...], list[str]]:
    from gpunb.analysis.oom import nvml_index_for, process_memory
    from gpunb.readings.gpu import read_sample
    from gpunb.readings.nvml import is_available
    from gpunb.readings.torch_memory import cuda_initialized, read_device

    problems: list[str] = []
    status = nvml.start()
    if not status.ok:
        problems.append(f"NVML: {status.cause} {status.fix}")
    rows = []
    if cuda_initialized(torch):
        for i in range(torch.cuda.device_count()):
            t = read_device(torch, i)
            nidx = nvml_index_for(torch, i, nvml) if status.ok else None
            mine, others = (process_memory(nvml, nidx, torch_reserved=t.reserved_bytes if t else None)
                            if status.ok else (None, ()))
            used = total = None
            if nidx is not None:
                s = read_sample(nvml, nidx)
                if s.lost:
                    problems.append(f"cuda:{i} (NVML GPU {nidx}) has fallen off the bus (NVML: GPU is lost); "
                                    "a GPU reset or reboot (administrator) is needed.")
                used = s.memory_used_bytes if is_available(s.memory_used_bytes) else None
                total = s.memory_total_bytes if is_available(s.memory_total_bytes) else None
            try:
                name = torch.cuda.get_device_name(i)
            except Exception:
                name = f"cuda:{i}"
            rows.append(GpuMemoryRow(i, name, total or (t.total_bytes if t else None), used, mine,
                                     t.allocated_bytes if t else None, t.reserved_bytes if t else None,
                                     sum(p.used_bytes or 0 for p in others)))
    elif status.ok:
        for i in range(nvml.device_count()):
            s = read_sample(nvml, i)
            if s.lost:
                problems.append(f"GPU {i} has fallen off the bus (NVML: GPU is lost): its memory cannot be read; "
                                "`dmesg` shows the Xid error, and a GPU reset or reboot (administrator) is needed.")
            name = nvml.device_query(i, "nvmlDeviceGetName")
            mine, others = process_memory(nvml, i)
            rows.append(GpuMemoryRow(
                i, name if is_available(name) else f"GPU {i}",
                s.memory_total_bytes if is_available(s.memory_total_bytes) else None,
                s.memory_used_bytes if is_available(s.memory_used_bytes) else None,
                mine, None, None, sum(p.used_bytes or 0 for p in others)))
    return tuple(rows), problems


def free_variables(names: Iterable[str], namespace: dict, *, shell: Any = None, torch: Any = None) -> FreedVariables:
    """Delete ``names`` from the namespace (and the output history), collect, empty the cache."""
    torch = torch if torch is not None else sys.modules.get("torch")
    device = 0 if torch is not None and _cuda(torch) else None
    before_census = take_census(namespace, torch=torch) if torch is not None else Census(())
    before = measure(torch, device)
    gone, missing = [], []
    for name in names:
        if name in namespace:
            if shell is not None and hasattr(shell, "del_var"):
                shell.del_var(name, by_name=False)  # like %xdel: also drops it from Out
            else:
                del namespace[name]
            gone.append(name)
        else:
            missing.append(name)
    gc.collect()
    if torch is not None and _cuda(torch):
        torch.cuda.empty_cache()
    after = measure(torch, device)
    after_census = take_census(namespace, torch=torch) if torch is not None else Census(())
    freed = max(0, sum(e.nbytes for e in before_census.entries) - sum(e.nbytes for e in after_census.entries))
    return FreedVariables(tuple(gone), tuple(missing), before, after, freed)


def _cuda(torch: Any) -> bool:
    from gpunb.readings.torch_memory import cuda_initialized

    return cuda_initialized(torch)


def memory(
    *,
    free: Iterable[str] = (),
    top: int = 20,
    all_devices: bool = False,
    namespace: dict | None = None,
    shell: Any = None,
    nvml: Any = None,
) -> MemoryReport:
    """Where GPU memory goes now (``%gpumem``). ``free=["x"]`` deletes variables first.

    Tensors shown are CUDA tensors when this kernel uses CUDA; otherwise (or with
    ``all_devices``) tensors on every device, so it also explains a CPU session.
    """
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_memory import imported_torch

    if shell is None:
        ipy = sys.modules.get("IPython")
        shell = ipy.get_ipython() if ipy is not None else None
    if namespace is None:
        namespace = shell.user_ns if shell is not None else {}
    if isinstance(free, str):
        free = free.split()
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be a positive whole number, got {top!r}")
    torch = imported_torch()
    nvml = nvml if nvml is not None else default_session()
    problems: list[str] = []
    freed = free_variables(list(free), namespace, shell=shell, torch=torch) if free else None
    if torch is None:
        problems.append("torch is not imported in this kernel, so there are no tensors to name; "
                        "`import torch` first (gpunb never imports it for you).")
    elif not _cuda(torch):
        problems.append("this kernel has not used CUDA yet (no CUDA context): showing tensors on all devices."
                        if torch.backends.cuda.is_built() and nvml.device_count() > 0 else
                        "torch sees no CUDA GPU (CPU-only build or no driver): showing CPU tensors. "
                        "Run %gpucheck to see why.")
    with nvml.budget(NVML_BUDGET_S, "%gpumem"):  # a hung NVML costs the cell at most this (plus one call)
        gpus, nvml_problems = _gpu_rows(torch, nvml) if torch is not None else _gpu_rows_no_torch(nvml)
    problems.extend(nvml_problems)
    use_cuda = torch is not None and _cuda(torch) and not all_devices
    census = None
    if torch is not None:
        oh = namespace.get("Out")
        census = take_census(namespace, torch=torch, devices={"cuda"} if use_cuda else None,
                             output_history=oh if isinstance(oh, dict) else None,
                             exceptions=[("old exception (sys.last_value)", getattr(sys, "last_value", None))])
        if census.skipped_count:
            problems.append(census.skipped_note())
    return MemoryReport(gpus, census, problems, freed, top, "cuda" if use_cuda else "all")


def _gpu_rows_no_torch(nvml: Any) -> tuple[tuple[GpuMemoryRow, ...], list[str]]:
    class _NoTorch:
        class cuda:  # noqa: N801
            @staticmethod
            def is_available() -> bool:
                return False

            @staticmethod
            def is_initialized() -> bool:
                return False

    return _gpu_rows(_NoTorch, nvml)


