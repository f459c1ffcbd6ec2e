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

from gpunb.analysis.oom_message import find_oom
from gpunb.analysis.release import keep_traceback_default

KEEP_KEY = "oom_keep_traceback"
LAST_KEY = "last_oom"


def keep_traceback(state: Any) -> bool:
    value = state.shared.get(KEEP_KEY)
    return keep_traceback_default() if value is None else bool(value)


class OomHook:
    def __init__(self, shell: Any, state: Any) -> None:
        self.shell = shell
        self.state = state
        self.before_ids: dict[str, int] | None = None
        self.extra_types: tuple[type, ...] = ()  # more exception classes to treat as OOM (tests, libraries)

    def pre(self, info: Any = None) -> None:
        if "torch" not in sys.modules:
            self.before_ids = None
            return
        self.before_ids = {k: id(v) for k, v in list(self.shell.user_ns.items())
                           if isinstance(k, str) and not k.startswith("_")}

    def post(self, result: Any) -> None:
        exc = getattr(result, "error_in_exec", None)
        if exc is None:
            return
        if "torch" not in sys.modules and not self.extra_types:
            return
        try:
            if find_oom(exc, self.extra_types) is None:
                return
            diagnosis = handle_oom(self.shell, exc, before_ids=self.before_ids,
                                   keep=keep_traceback(self.state))
            self.state.shared[LAST_KEY] = diagnosis
            from IPython.display import display

            display(diagnosis)
        except Exception as err:  # the doctor must never add a traceback of its own
            print(f"gpunb: could not diagnose this out-of-memory error ({_describe(err)}); "
                  "%gpumem shows what holds memory.")


def _describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {str(err)[:200]}"
    except Exception:
        return type(err).__name__


# NVML time the doctor may take (the process list, this process's memory).
DOCTOR_NVML_BUDGET_S = 1.0


def handle_oom(shell: Any, exc: BaseException, *, before_ids: dict[str, int] | None = None,
               keep: bool = False) -> Any:
    """Diagnose ``exc`` with the notebook's readings, then release what it pins (the
    release happens even when reading the notebook failed)."""
    from gpunb.analysis.oom import gather_readings
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_memory import cuda_initialized, imported_torch

    torch = imported_torch()
    cuda = cuda_initialized(torch)
    devices = {"cuda"} if cuda else None
    ns = shell.user_ns
    oh = ns.get("Out")
    with default_session().budget(DOCTOR_NVML_BUDGET_S, "the OOM doctor"):
        try:
            diagnosis = gather_readings(exc, namespace=ns, output_history=oh if isinstance(oh, dict) else None,
                                        before_ids=before_ids, devices=devices)
        except Exception as err:  # whatever the readings met, the memory is still given back below
            from gpunb.analysis.oom import diagnose

            diagnosis = diagnose(exc)
            diagnosis.notes.append(f"the notebook's memory could not be read ({_describe(err)}); this "
                                   "diagnosis uses the error message only")
        return _release(shell, exc, diagnosis, torch=torch, cuda=cuda, devices=devices, keep=keep)


def _release(shell: Any, exc: BaseException, diagnosis: Any, *, torch: Any, cuda: bool, devices: Any,
             keep: bool) -> Any:
    from gpunb.analysis.oom import nvml_index_for, process_memory
    from gpunb.analysis.oom_message import parse_oom_message
    from gpunb.analysis.release import release_failure
    from gpunb.analysis.tensor_census import EXCEPTION
    from gpunb.readings.nvml import default_session

    device = None
    nvml_bytes = None
    try:  # the numbers around the release are a bonus: without them the memory still comes back
        msg = parse_oom_message(str(find_oom(exc) or exc))
        if cuda:
            device = msg.device if msg is not None and msg.device is not None else torch.cuda.current_device()
            nvml = default_session()
            if nvml.start().ok:
                index = nvml_index_for(torch, device, nvml)
                nvml_bytes = lambda: process_memory(  # noqa: E731
                    nvml, index, torch_reserved=int(torch.cuda.memory_reserved(device)))[0]
    except Exception as err:
        diagnosis.notes.append(f"memory before/after the release could not be measured ({_describe(err)})")
    pinned = diagnosis.census.total_bytes(source=EXCEPTION) if diagnosis.census is not None else None
    diagnosis.release = release_failure(shell, exc, torch=torch, device=device, keep_traceback=keep,
                                        devices=devices, nvml_process_bytes=nvml_bytes, pinned_bytes=pinned)
    return diagnosis


def diagnose_oom(exc: BaseException | None = None, *, release: bool = False, **kwargs: Any) -> Any:
    """Explain a CUDA out-of-memory error (``gpunb.diagnose_oom(exc)``); with ``release=True``
    also give back the memory it pins, as the automatic doctor does after a failed cell
    (for an error you caught yourself: ``except torch.OutOfMemoryError as e``).
    Without ``exc`` it uses the session's last error (``sys.last_value``)."""
    from gpunb.analysis.oom import diagnose_oom as explain

    if not release:
        return explain(exc, **kwargs)
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("diagnose_oom(release=True) needs an IPython/Jupyter session: it releases what the "
                           "notebook's traceback and output history pin. Outside one, `del` the exception and "
                           "call torch.cuda.empty_cache().")
    exc = exc if exc is not None else getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException) or find_oom(exc) is None:
        return explain(exc, **kwargs)  # raises the ValueError that says what it needs
    from gpunb.shells.extension import state_of

    state = state_of(shell)
    keep = keep_traceback(state) if state is not None else keep_traceback_default()
    return handle_oom(shell, exc, keep=keep)


def register(shell: Any, state: Any) -> None:
    hook = OomHook(shell, state)
    state.shared["oom_hook"] = hook
    state.on("pre_run_cell", hook.pre)
    state.on("post_run_cell", hook.post)
