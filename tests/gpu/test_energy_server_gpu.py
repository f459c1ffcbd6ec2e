"""On a real GPU: ``%gpuenergy``'s energy since ``%load_ext gpunb`` against NVML's counter read
directly (pynvml, not through gpunb) around the same 5 s bf16 matmul burst, within 2 %; and the
server's per-kernel energy (busy, then idle) against the GPU's counter over the same intervals
(in-process: no Jupyter server needed).

Writes ``energy_server.json`` and ``energy_server_kernels.json`` to ``$GPUNB_RESULTS``.
Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_energy_server_gpu.py -v
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("IPython")
pynvml = pytest.importorskip("pynvml")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from IPython.utils.capture import capture_output  # noqa: E402

from tests.gpu.results import save_json  # noqa: E402

BURST_S = 5.0
SETTLE_S = 0.5  # after the burst: the counter's ~90 ms steps are then worth ~10 J (idle), not ~60 J


def _nvml_handle_of_cuda0():
    pynvml.nvmlInit()
    want = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid.lower().removeprefix("gpu-") == want:
            return i, h
    raise AssertionError(f"no NVML GPU has cuda:0's UUID {want}")


def _burst(seconds: float) -> int:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            a @ b
        n += 20
        torch.cuda.synchronize()
    return n


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    with capture_output():
        ip.run_line_magic("unload_ext", "gpunb")
    yield ip
    with capture_output():
        ip.run_line_magic("unload_ext", "gpunb")
    ip.user_ns.pop("spent", None)


def test_gpuenergy_since_load_matches_the_counter_read_directly(shell):
    from gpunb.shells.extension import kernel_state

    index, handle = _nvml_handle_of_cuda0()
    _burst(0.5)  # CUDA context and cuBLAS up before the window: their start is not what is measured
    with capture_output():  # gpunb's modules imported once, so the measured load is only the load
        shell.run_cell("%load_ext gpunb")
        shell.run_cell("%gpuenergy")
        shell.run_line_magic("unload_ext", "gpunb")
    time.sleep(SETTLE_S)
    direct0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    t0 = time.monotonic()
    with capture_output():
        shell.run_cell("%load_ext gpunb")  # its end queues gpunb's first reading on the NVML worker
    first = kernel_state(shell).energy_since_load.first()
    assert index in first.counters_mj, first
    burst_start = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    matmuls = _burst(BURST_S)
    burst_end = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    time.sleep(SETTLE_S)
    with capture_output() as out:
        shell.run_cell("%gpuenergy -o spent")
    direct1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    seconds = time.monotonic() - t0
    spent = shell.user_ns["spent"]
    mine = next(g for g in spent.gpus if g.index == index)
    direct_j = (direct1 - direct0) / 1000.0
    burst_j = (burst_end - burst_start) / 1000.0
    error = (mine.joules - direct_j) / direct_j
    shown = out.stdout + "".join(o.data.get("text/plain", "") for o in out.outputs)
    save_json("energy_server.json", {
        "gpu": torch.cuda.get_device_name(0), "nvml_index": index, "burst_s": BURST_S, "matmuls": matmuls,
        "gpuenergy_j": mine.joules, "gpuenergy_s": mine.seconds, "gpuenergy_average_w": mine.average_w,
        "direct_counter_j": direct_j, "direct_window_s": seconds, "burst_only_j": burst_j,
        "relative_error": error, "shown": shown,
    })
    assert burst_j > 1000, f"the burst spent only {burst_j:.0f} J: not a busy GPU"
    assert abs(error) < 0.02, f"%gpuenergy {mine.joules:.0f} J vs the counter read directly {direct_j:.0f} J"
    assert shown.startswith("This kernel's") and "since %load_ext gpunb" in shown


def test_the_server_gives_a_kernel_its_gpus_energy_while_it_holds_it():
    """The server's report and ledger in this process, this process standing in for a kernel
    (no Jupyter server needed): a busy interval, then an idle one, against the counter."""
    import os

    from gpunb.analysis.holders.gpus import build_report
    from gpunb.analysis.holders.kernel_energy import KernelEnergyLedger, idle_energy_line
    from gpunb.readings.nvml import NvmlSession
    from gpunb.readings.server_kernels import KernelInfo, SessionInfo

    index, _ = _nvml_handle_of_cuda0()
    _burst(0.2)  # this process holds the GPU (a CUDA context) before the first report
    nvml = NvmlSession()
    notebook = (SessionInfo("energy.ipynb", "energy.ipynb", "notebook"),)

    def kernel(state: str, last_activity: float) -> KernelInfo:
        return KernelInfo("k-self", "python3", os.getpid(), state, last_activity, 1, notebook)

    ledger = KernelEnergyLedger()
    r0 = ledger.account(build_report(nvml, (kernel("busy", time.time()),)))
    _burst(3.0)
    r1 = ledger.account(build_report(nvml, (kernel("busy", time.time()),)))
    idle_since = time.time()  # the "cell" ended: the kernel idles from here, holding its CUDA memory
    time.sleep(3.0)
    r2 = ledger.account(build_report(nvml, (kernel("idle", idle_since),)))
    time.sleep(3.0)
    r3 = ledger.account(build_report(nvml, (kernel("idle", idle_since),)))

    def device(r):
        return next(d for d in r.devices if d.index == index)

    def mine(r):
        return next(h for h in device(r).holders if h.kernel_id == "k-self" and h.energy_j is not None)

    def holders(r):  # who held the GPU: others on a shared machine share each interval equally
        return {(h.kernel_id or h.pid) for h in device(r).holders}

    gpu_j = [device(r).energy_mj / 1000.0 for r in (r0, r1, r2, r3)]
    shares = [len(holders(a) & holders(b)) for a, b in ((r0, r1), (r1, r2), (r2, r3))]
    expected = sum((gpu_j[i + 1] - gpu_j[i]) / shares[i] for i in range(3))
    line = idle_energy_line(mine(r3), r3.t_unix)
    result = {
        "gpu_counter_j": gpu_j, "holders_per_interval": shares, "kernel_energy_j": mine(r3).energy_j,
        "expected_j": expected, "idle_energy_j": mine(r3).idle_energy_j, "idle_line": line,
        "busy_interval_j": gpu_j[1] - gpu_j[0],
    }
    try:
        from prometheus_client.parser import text_string_to_metric_families

        from gpunb.views.metrics_view import metrics_text

        families = {f.name: f for f in text_string_to_metric_families(metrics_text(r3)[0].decode())}
        exported = next(s.value for s in families["gpunb_gpu_energy_joules"].samples if s.labels["gpu"] == str(index))
        result["metric_gpu_energy_j"] = exported
        assert exported == pytest.approx(gpu_j[3])
    except ImportError:
        result["metric_gpu_energy_j"] = "prometheus_client not installed here: metrics not checked"
    save_json("energy_server_kernels.json", result)
    assert gpu_j[1] - gpu_j[0] > 500, "the busy interval spent too little to tell"
    assert mine(r3).energy_j == pytest.approx(expected, rel=1e-6)
    assert mine(r3).idle_energy_j == pytest.approx((gpu_j[3] - gpu_j[2]) / shares[2], rel=1e-6)
    # idle for ~6 s, of which the last ~3 s were measured idle at both ends
    assert line.startswith(f"energy.ipynb held GPU {index} idle for ") and "of it measured" in line, line
