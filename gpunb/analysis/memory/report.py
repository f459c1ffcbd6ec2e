"""``gpunb.memory()`` / ``%gpumem``: where VRAM went, right now.

Per GPU: NVML's used memory, this process (NVML per-process), torch allocated and reserved,
and the rest of this process (CUDA context, cuDNN/cuBLAS workspaces, other libraries).
Then the live tensors by notebook name, and leftovers (output history, old exceptions).
``free`` deletes named variables first and reports what came back.
"""

from __future__ import annotations

import gc
import re
import sys
from collections.abc import Iterable
from typing import Any

from gpunb.analysis.machine import machine_of, without_gpu
from gpunb.analysis.memory.census import Census, take_census
from gpunb.analysis.memory.records import FreedVariables, GpuMemoryRow, MemoryReport
from gpunb.analysis.memory.release import measure

NVML_BUDGET_S = 1.0  # what %gpumem may spend on NVML: a hung driver costs the cell at most this (plus one call)


def _gpu_rows(torch: Any, nvml: Any) -> tuple[tuple[GpuMemoryRow, ...], list[str]]:
    from gpunb.readings import torch_state
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.gpu import read_sample
    from gpunb.readings.nvml import is_available

    problems: list[str] = []
    status = nvml.start()
    if not status.ok:
        problems.append(without_gpu(status))
    rows = []
    if torch_state.cuda_initialized(torch):
        device_map = read_device_map(nvml, torch=torch) if status.ok else None
        for i in range(torch_state.device_count(torch)):
            t = torch_state.read_device_memory(torch, i)
            nidx = device_map.nvml_index(i) if device_map is not None else None
            own = read_ownership(nvml, nidx, torch=torch, device_map=device_map) if nidx is not None else None
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
            if own is not None and own.note:
                problems.append(f"cuda:{i} (NVML GPU {nidx}): {own.note}.")
            rows.append(GpuMemoryRow(i, name, total or (t.total_bytes if t else None), used,
                                     own.self_bytes if own else None, t.allocated_bytes if t else None,
                                     t.reserved_bytes if t else None, own.others_bytes if own else None,
                                     nidx, own.children_bytes if own else None, own.how if own else ""))
    elif status.ok:
        for i in range(nvml.device_count()):
            s = read_sample(nvml, i)
            if s.lost:
                problems.append(f"GPU {i} has fallen off the bus (NVML: GPU is lost): its memory cannot be read; "
                                "`dmesg` shows the Xid error, and a GPU reset or reboot (administrator) is needed.")
            name = nvml.device_query(i, "nvmlDeviceGetName")
            own = read_ownership(nvml, i, torch=torch)
            if own.note:
                problems.append(f"GPU {i}: {own.note}.")
            rows.append(GpuMemoryRow(
                i, name if is_available(name) else f"GPU {i}",
                s.memory_total_bytes if is_available(s.memory_total_bytes) else None,
                s.memory_used_bytes if is_available(s.memory_used_bytes) else None,
                own.self_bytes, None, None, own.others_bytes, i, own.children_bytes, own.how))
    return tuple(rows), problems


# Names Python and IPython keep in the notebook's namespace for themselves: deleting one broke
# the session (``Out``: every later cell ending in an expression failed with KeyError '_oh').
_SESSION_NAMES = frozenset({"In", "Out", "_oh", "_ih", "_dh", "_", "__", "___", "_i", "_ii", "_iii",
                            "get_ipython", "exit", "quit", "_sh"})
_HISTORY_NAME = re.compile(r"_i?\d+")  # _5 (output 5), _i5 (input 5)


def session_names(names: Iterable[str], namespace: dict[str, Any] | None = None,
                  hidden: Iterable[str] = ()) -> list[str]:
    """The names among ``names`` that belong to Python or IPython, not to the user: dunders
    (``__builtins__``), the history (``In``, ``Out``, ``_``, ``_i3``, ``_3`` ...), ``exit`` and
    the like, and whatever the shell itself put in the namespace (``hidden``: its
    ``user_ns_hidden``) unless the user has rebound it since."""
    hidden_set = set(hidden)
    out = []
    for name in names:
        ours = name in hidden_set and namespace is not None and name in namespace
        if ((name.startswith("__") and name.endswith("__")) or name in _SESSION_NAMES
                or _HISTORY_NAME.fullmatch(name) or ours):
            out.append(name)
    return out


def refuse_session_names(names: list[str], namespace: dict[str, Any], shell: Any) -> None:
    hidden = getattr(shell, "user_ns_hidden", None)
    hidden_names = [n for n in names if isinstance(hidden, dict) and n in hidden and hidden[n] is namespace.get(n)]
    refused = session_names(names, namespace, hidden_names)
    if refused:
        listed = ", ".join(refused)
        raise ValueError(f"not freeing {listed}: {'it belongs' if len(refused) == 1 else 'they belong'} to Python "
                         "or IPython (the output and input history, builtins), and deleting "
                         f"{'it' if len(refused) == 1 else 'them'} breaks the session; nothing was deleted. "
                         "Name your own variables; to drop tensors held by the output history, "
                         "use `%reset -f out`.")


def free_variables(names: Iterable[str], namespace: dict[str, Any], *, shell: Any = None,
                   torch: Any = None) -> FreedVariables:
    """Delete ``names`` from the namespace (and the output history), collect, empty the cache.
    All or nothing: a name of Python's or IPython's own (``session_names``) refuses the lot
    (``ValueError``) before anything is deleted."""
    names = list(names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"free takes variable names (str), got {type(bad[0]).__name__}")
    refuse_session_names(names, namespace, shell)
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
    from gpunb.readings.torch_state import cuda_initialized

    return cuda_initialized(torch)


def memory(
    *,
    free: Iterable[str] = (),
    top: int = 20,
    all_devices: bool = False,
    namespace: dict[str, Any] | None = None,
    shell: Any = None,
    nvml: Any = None,
) -> MemoryReport:
    """Where GPU memory goes now (``%gpumem``). ``free=["x"]`` deletes variables first.

    ``namespace`` holds the variables to name tensors by (the notebook's, passed in by the
    shells layer); ``shell``, when given, deletes variables like ``%xdel`` (from the output
    history too).
    Tensors shown are CUDA tensors when this kernel uses CUDA; otherwise (or with
    ``all_devices``) tensors on every device, so it also explains a CPU session.
    """
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_state import imported_torch

    if namespace is None:
        namespace = {}
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
        gpu_count = nvml.device_count()
        if torch.backends.cuda.is_built() and gpu_count > 0:
            problems.append("this kernel has not used CUDA yet (no CUDA context): showing tensors on all devices.")
        elif gpu_count > 0:  # a GPU beside a CPU build of torch: the machine's statement, with its install fix
            problems.append(machine_of(nvml).text() + " Showing the tensors on the CPU.")
        else:  # no GPU: the machine's statement comes with the NVML rows below
            problems.append("Showing the tensors on the CPU.")
    with nvml.budget(NVML_BUDGET_S, "%gpumem"):
        gpus, nvml_problems = _gpu_rows(torch, nvml)
    problems[:0] = nvml_problems  # the machine's state first
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

