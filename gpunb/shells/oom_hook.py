"""The automatic OOM doctor: after a cell fails with a CUDA out-of-memory error, explain it
and give the memory back.

It is a ``post_run_cell`` callback: IPython has already shown the user's traceback (the
exception is never replaced or swallowed; the kernel still reports the cell as failed).
Cells that succeed cost one attribute check; torch is touched only when the user has
imported it. A ``pre_run_cell`` callback notes which variables existed before each cell
(names and object ids: cheap), so tensors left from earlier cells can be told apart.
"""

from __future__ import annotations

import sys
from typing import Any

from gpunb.analysis.memory.oom_message import find_oom
from gpunb.analysis.memory.release import keep_traceback_default
from gpunb.shells.kernel_state import KernelState


def keep_traceback(kernel: KernelState) -> bool:
    """Keep a failed cell's frames for %debug? ``%gpumem --keep-traceback``, else the environment."""
    return keep_traceback_default() if kernel.oom_keep_traceback is None else kernel.oom_keep_traceback


class OomHook:
    """The pre/post_run_cell callbacks; what they keep between cells is in ``kernel``."""

    def __init__(self, shell: Any, kernel: KernelState) -> None:
        self.shell = shell
        self.kernel = kernel

    def pre(self, info: Any = None) -> None:
        if "torch" not in sys.modules:
            self.kernel.names_before_cell = None
            return
        self.kernel.names_before_cell = {k: id(v) for k, v in list(self.shell.user_ns.items())
                                         if isinstance(k, str) and not k.startswith("_")}

    def post(self, result: Any) -> None:
        exc = getattr(result, "error_in_exec", None)
        if exc is None:
            return
        extra_types = self.kernel.extra_oom_types
        if "torch" not in sys.modules and not extra_types:
            return
        try:
            if find_oom(exc, extra_types) is None:
                return
            diagnosis = handle_oom(self.shell, exc, before_ids=self.kernel.names_before_cell,
                                   keep=keep_traceback(self.kernel), history=self.kernel.alloc_history)
            self.kernel.last_oom = diagnosis
            from IPython.display import display

            display(diagnosis)
        except BaseException as err:  # noqa: BLE001 (never a traceback of its own, never a lost reply)
            print(f"gpunb: could not diagnose this out-of-memory error ({_describe(err)}); "
                  "%gpumem shows what holds memory.")


def _describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {str(err)[:200]}"
    except BaseException:  # noqa: BLE001 (a user exception's __str__ may raise anything)
        return type(err).__name__


# NVML time the doctor may take (the process list, this process's memory).
DOCTOR_NVML_BUDGET_S = 1.0


def handle_oom(shell: Any, exc: BaseException, *, before_ids: dict[str, int] | None = None,
               keep: bool = False, history: Any = None) -> Any:
    """Diagnose ``exc`` with the notebook's readings, then release what it pins (the
    release happens even when reading the notebook failed). ``history``: the armed allocation
    history (``%gpumem --trace on``); its snapshot is read before the release, while the failed
    cell's blocks are still alive."""
    from gpunb.analysis.fit.search import last_fit
    from gpunb.analysis.memory.oom import gather_readings
    from gpunb.analysis.plan.planner import last_plan
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_state import cuda_initialized, imported_torch

    torch = imported_torch()
    cuda = cuda_initialized(torch)
    devices = {"cuda"} if cuda else None
    ns = shell.user_ns
    oh = ns.get("Out")
    with default_session().budget(DOCTOR_NVML_BUDGET_S, "the OOM doctor"):
        try:
            diagnosis = gather_readings(exc, namespace=ns, output_history=oh if isinstance(oh, dict) else None,
                                        before_ids=before_ids, devices=devices, last_fit=last_fit(),
                                        last_plan=last_plan())
        # whatever the readings met (a namespace object raising CancelledError on attribute access,
        # say), the memory is still given back below and the cell's reply still goes out
        except BaseException as err:  # noqa: BLE001
            from gpunb.analysis.memory.oom import diagnose

            diagnosis = diagnose(exc, last_fit=last_fit(), last_plan=last_plan())
            diagnosis.notes.append(f"the notebook's memory could not be read ({_describe(err)}); this "
                                   "diagnosis uses the error message only")
        if history is not None and cuda:
            _add_sites(shell, diagnosis, history, torch)
        return _release(shell, exc, diagnosis, torch=torch, cuda=cuda, devices=devices, keep=keep)


def _add_sites(shell: Any, diagnosis: Any, history: Any, torch: Any) -> None:
    """The lines behind the failed request and the largest live blocks, from the armed history.
    The snapshot is plain data (frame strings, sizes, addresses): it pins no tensor."""
    try:
        from gpunb.analysis.memory.alloc_sites import shell_cell_numbers
        from gpunb.analysis.memory.alloc_trace import oom_sites
        msg = diagnosis.message
        device = msg.device if msg is not None and msg.device is not None else torch.cuda.current_device()
        snapshot = history.snapshot()
        diagnosis.alloc_sites = oom_sites(snapshot, device=device, cell_numbers=shell_cell_numbers(shell.compile))
        del snapshot
    except BaseException as err:  # noqa: BLE001 (the doctor and the release go on without the stacks)
        diagnosis.notes.append(f"the allocation history could not be read ({_describe(err)})")


def _release(shell: Any, exc: BaseException, diagnosis: Any, *, torch: Any, cuda: bool, devices: Any,
             keep: bool) -> Any:
    from gpunb.analysis.memory.census import EXCEPTION
    from gpunb.analysis.memory.oom_message import parse_oom_message
    from gpunb.analysis.memory.release import release_failure
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.nvml import default_session

    device = None
    nvml_bytes = None
    try:  # the numbers around the release are a bonus: without them the memory still comes back
        msg = parse_oom_message(str(find_oom(exc) or exc))
        if cuda:
            device = msg.device if msg is not None and msg.device is not None else torch.cuda.current_device()
            nvml = default_session()
            if nvml.start().ok:
                device_map = read_device_map(nvml, torch=torch)
                index = device_map.nvml_index(device)
                if index is not None:
                    nvml_bytes = lambda: read_ownership(  # noqa: E731
                        nvml, index, torch=torch, device_map=device_map, names=False).self_bytes
    except BaseException as err:  # noqa: BLE001 (the release below must still happen)
        diagnosis.notes.append(f"memory before/after the release could not be measured ({_describe(err)})")
    pinned = diagnosis.census.total_bytes(source=EXCEPTION) if diagnosis.census is not None else None
    try:
        diagnosis.release = release_failure(shell, exc, torch=torch, device=device, keep_traceback=keep,
                                            devices=devices, nvml_process_bytes=nvml_bytes, pinned_bytes=pinned,
                                            held_bytes=held_by(diagnosis.census))
    except BaseException as err:  # noqa: BLE001 (a user object in the history; the diagnosis still shows)
        diagnosis.notes.append(f"the memory could not all be given back ({_describe(err)}); "
                               "`%gpumem --release` tries again")
    return diagnosis


def held_by(census: Any) -> dict[str, int] | None:
    """Bytes of tensors per holder the release lets go: the failed cell's frames, the previous
    error's, each output-history entry (``release_failure`` names them the same way)."""
    if census is None:
        return None
    import re

    from gpunb.analysis.memory.census import EXCEPTION, OUTPUT_HISTORY
    from gpunb.analysis.memory.oom import PREVIOUS_ERROR

    held = {"frames": census.total_bytes(source=EXCEPTION), "previous error": census.total_bytes(source=PREVIOUS_ERROR)}
    for e in census.entries:
        if e.source == OUTPUT_HISTORY:
            entry = re.match(r"Out\[\d+\]", e.name)
            key = entry.group(0) if entry else e.name
            held[key] = held.get(key, 0) + e.nbytes
    return held


def register(shell: Any, state: Any) -> None:
    hook = OomHook(shell, state.kernel)
    state.on("pre_run_cell", hook.pre)
    state.on("post_run_cell", hook.post)
