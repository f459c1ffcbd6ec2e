"""Let a widget's clicks act while a cell runs: route its comm messages to a kernel subshell.

A click on a widget is a ``comm_msg`` on the kernel's shell channel, queued behind the cell
that is running; a monitor's Pause is wanted exactly then, during training. ipykernel 7
runs *subshells* (JEP 91: threads with their own message loop) and routes a comm's messages
to the subshell named by the comm's ``_reply_subshell_id`` (``ipykernel/comm/comm.py``,
``Kernel.shell_channel_thread_main``). gpunb asks for one subshell per kernel, the way the
control channel's ``create_subshell_request`` does, and points its controls' comms at it;
their callbacks then run on that thread while the main thread trains.

This uses ipykernel internals (7.x): anything missing or unexpected turns it off, and the
controls act between cells as they would without it. Never raises.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

REPLY_WAIT_MS = 2000  # the shell channel thread answers within milliseconds
_lock = threading.Lock()
_subshells: dict[int, str] = {}  # id(kernel) -> the subshell gpunb's controls use
_broken: set[int] = set()  # kernels where asking failed once: never again (no stray replies)


def controls_subshell(kernel: Any) -> str | None:
    """The id of the subshell for gpunb's controls in ``kernel`` (made on first use), or
    None where subshells are not available."""
    if kernel is None or not getattr(kernel, "_supports_kernel_subshells", False):
        return None
    key = id(kernel)
    with _lock:
        if key in _broken:
            return None
        try:
            manager = kernel.shell_channel_thread.manager
            known = _subshells.get(key)
            if known is not None and known in manager.list_subshell():
                return known
            socket = manager.control_to_shell_channel.from_socket
            socket.send_json({"type": "create"})
            if not socket.poll(REPLY_WAIT_MS):
                _broken.add(key)
                return None
            reply = socket.recv_json()
        except Exception:  # another ipykernel: the controls act between cells
            _broken.add(key)
            return None
        if not isinstance(reply, dict) or reply.get("status") != "ok" or not isinstance(reply.get("subshell_id"), str):
            _broken.add(key)
            return None
        _subshells[key] = reply["subshell_id"]
        return reply["subshell_id"]


def route_clicks(widgets: Iterable[Any], kernel: Any) -> bool:
    """Point the widgets' comms at the controls' subshell; True when they now act while a
    cell runs."""
    subshell = controls_subshell(kernel)
    if subshell is None:
        return False
    routed = False
    for widget in widgets:
        comm = getattr(widget, "comm", None)
        if comm is not None and hasattr(comm, "_reply_subshell_for"):
            comm._reply_subshell_id = subshell
            routed = True
    return routed


def close_controls_subshell(kernel: Any) -> bool:
    """End the controls' subshell thread (``%unload_ext``): the same request the control
    channel's ``delete_subshell_request`` sends. True when one was ended. Never raises."""
    if kernel is None:
        return False
    key = id(kernel)
    with _lock:
        subshell = _subshells.pop(key, None)
        _broken.discard(key)
        if subshell is None:
            return False
        try:
            socket = kernel.shell_channel_thread.manager.control_to_shell_channel.from_socket
            socket.send_json({"type": "delete", "subshell_id": subshell})
            if not socket.poll(REPLY_WAIT_MS):
                return False
            reply = socket.recv_json()
        except Exception:  # another ipykernel: nothing more to end
            return False
        return isinstance(reply, dict) and reply.get("status") == "ok"
