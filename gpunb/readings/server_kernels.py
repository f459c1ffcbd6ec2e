"""The kernels a Jupyter server runs and the notebooks/consoles they belong to, as records.

Read from the server's own managers (``serverapp.kernel_manager``,
``serverapp.session_manager``); nothing here imports jupyter_server, so the records can be
built from any object with the same methods. Must run on the server's event loop (the
session manager is an SQLite table used from that thread only).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class SessionInfo:
    """A notebook, console or file attached to a kernel (jupyter_server's session model)."""

    path: str
    name: str
    type: str  # "notebook", "console", "file"...


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of this server."""

    kernel_id: str
    spec_name: str
    pid: int | None  # None: a provisioner that does not run it here (remote, gateway)
    execution_state: str  # "idle", "busy", "starting", "dead", "unknown"
    last_activity_unix: float | None
    connections: int
    sessions: tuple[SessionInfo, ...] = ()

    @property
    def path(self) -> str:
        """The notebook (or console) path, '' when no session names one."""
        return self.sessions[0].path if self.sessions else ""


def kernel_pid(kernel: Any) -> int | None:
    """The process of a kernel started by a local provisioner (jupyter_client's
    ``LocalProvisioner`` keeps ``pid`` and ``process``); None for any other."""
    provisioner = getattr(kernel, "provisioner", None)
    for value in (getattr(provisioner, "pid", None), getattr(getattr(provisioner, "process", None), "pid", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _unix(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def read_server_kernels(kernel_manager: Any, session_manager: Any = None) -> tuple[KernelInfo, ...]:
    """Every kernel of the server with its PID, state, last activity and sessions."""
    by_kernel: dict[str, list[SessionInfo]] = {}
    if session_manager is not None:
        for s in await _maybe_await(session_manager.list_sessions()):
            kernel = s.get("kernel") or {}
            if kernel.get("id"):
                by_kernel.setdefault(kernel["id"], []).append(
                    SessionInfo(str(s.get("path") or ""), str(s.get("name") or ""), str(s.get("type") or "")))
    out = []
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
            model = kernel_manager.kernel_model(kernel_id)  # the public view: state, activity, connections
        except Exception:  # shut down between the list and now (KeyError, or the server's 404)
            continue
        out.append(KernelInfo(
            kernel_id=kernel_id,
            spec_name=str(model.get("name") or ""),
            pid=kernel_pid(kernel),
            execution_state=str(model.get("execution_state") or "unknown"),
            last_activity_unix=_unix(model.get("last_activity")),
            connections=int(model.get("connections") or 0),
            sessions=tuple(by_kernel.get(kernel_id, ())),
        ))
    return tuple(out)
