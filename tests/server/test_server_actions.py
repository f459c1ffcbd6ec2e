"""Shutting down an idle kernel that holds GPU memory: only with a confirmation, only this
server's own kernels, not a busy one unless forced, never one that frees nothing."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from tornado.httpclient import HTTPClientError

from .conftest import GiB, hold, kernel_holding_devices, run_in_kernel, start_cell, start_session, wait_for_state


def _post(jp_fetch, kernel_id: str, body, **kwargs):
    data = body if isinstance(body, str) else json.dumps(body)
    return jp_fetch("gpunb", "api", "kernels", kernel_id, "shutdown", method="POST", body=data, **kwargs)


async def _refused(call) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as err:
        await call
    return err.value.code, json.loads(err.value.response.body)["message"]


async def test_shutdown_needs_confirmation_and_frees_only_this_servers_idle_kernels(jp_fetch, jp_serverapp, fake_gpu):
    fake_gpu.gpus[0].drop_exited = True  # like the driver: a process that exits holds nothing
    km = jp_serverapp.kernel_manager
    idle = (await start_session(jp_fetch, "lesson3.ipynb"))["kernel"]["id"]
    busy = (await start_session(jp_fetch, "training.ipynb"))["kernel"]["id"]
    empty = (await start_session(jp_fetch, "notes.ipynb"))["kernel"]["id"]
    idle_pid = await kernel_holding_devices(jp_serverapp, idle)
    busy_pid = await kernel_holding_devices(jp_serverapp, busy)
    hold(fake_gpu, idle_pid, 31 * GiB)
    hold(fake_gpu, busy_pid, 9 * GiB)
    await run_in_kernel(jp_serverapp, empty, "pass")  # the server records "idle" after its first reply

    code, message = await _refused(_post(jp_fetch, idle, {}))
    assert code == 400 and "confirm" in message
    code, message = await _refused(_post(jp_fetch, idle, {"confirm": True}))  # must name the kernel
    assert code == 400
    code, message = await _refused(_post(jp_fetch, idle, "not json"))
    assert code == 400 and "JSON" in message
    code, message = await _refused(_post(jp_fetch, idle, {"confirm": idle, "force": "yes"}))
    assert code == 400 and "force" in message
    stranger = str(uuid.uuid4())
    code, message = await _refused(_post(jp_fetch, stranger, {"confirm": stranger}))
    assert code == 404 and "only this server's own kernels" in message
    code, message = await _refused(_post(jp_fetch, empty, {"confirm": empty}))
    assert code == 409 and "notes.ipynb holds no GPU memory" in message
    with pytest.raises(HTTPClientError) as err:  # not a kernel id at all: no route
        await _post(jp_fetch, "..%2F..%2Fapi%2Fkernels", {"confirm": "x"})
    assert err.value.code == 404

    kc = await start_cell(jp_serverapp, busy, "import time; time.sleep(60)")
    try:
        await wait_for_state(jp_serverapp, busy, "busy")
        code, message = await _refused(_post(jp_fetch, busy, {"confirm": busy}))
        assert code == 409 and "training.ipynb is busy" in message
        assert busy in km
        r = await _post(jp_fetch, busy, {"confirm": busy, "force": True})
        assert json.loads(r.body)["execution_state_before"] == "busy"
    finally:
        kc.stop_channels()
    assert busy not in km

    r = await _post(jp_fetch, idle, {"confirm": idle})
    result = json.loads(r.body)
    assert result["kernel_id"] == idle and result["path"] == "lesson3.ipynb"
    assert result["execution_state_before"] == "idle"
    assert result["held_bytes"] == {"0": 31 * GiB}
    assert result["memory_used_before_bytes"] == {"0": 31 * GiB}
    assert result["memory_used_after_bytes"] == {"0": 0}  # read again after the kernel exited
    assert result["other_processes_before_bytes"] == result["other_processes_after_bytes"] == {"0": 0}
    assert result["freed_bytes"] == {"0": 31 * GiB}
    assert idle not in km and not os.path.exists(f"/proc/{idle_pid}")
    assert empty in km  # the kernel that held nothing is untouched


def test_freed_memory_is_net_of_other_processes_meanwhile():
    from gpunb.shells.server_service import ShutdownResult

    # the kernel held 10 GiB; meanwhile another process grew by 3 GiB on the same GPU
    r = ShutdownResult("k", "a.ipynb", "idle", {0: 10 * GiB}, {0: 40 * GiB}, {0: 33 * GiB},
                       {0: 20 * GiB}, {0: 23 * GiB})
    assert r.freed_bytes == {0: 10 * GiB}
    assert r.to_dict()["freed_bytes"] == {"0": 10 * GiB}
    assert ShutdownResult("k", "", "idle", {0: 1}, {0: None}, {0: 5}).freed_bytes == {0: None}
