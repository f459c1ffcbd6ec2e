"""The monitor's energy and link charts on a real GPU: a pinned host→device copy loop, then a bf16
matmul burst, while the sampler runs at 10 Hz in its thread.

- the PCIe host→GPU chart's readings reach >= 20 GB/s during the copies (the H200 moved 58.9 GB/s
  in the recording);
- the energy since the start equals (within 2 %) NVML's counter read directly through pynvml
  right after the sampler's first and last readings;
- the frame has the energy line and the PCIe panels, and no NVLink panel on a GPU without
  active links (the H200 alone: NVML answers NOT_SUPPORTED there);
- a tick with the new reads against one without (ms per tick, side by side).

Writes ``monitor_links_gpu.json`` and the frame (``monitor_links_frame.html``) to
``$GPUNB_RESULTS``. About 30 s on one H200.
"""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (this test runs on the GPU test machine)", allow_module_level=True)

from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.readings.nvml import default_session  # noqa: E402
from gpunb.views.monitor_layout import monitor_html, monitor_text  # noqa: E402
from tests.gpu.results import RESULTS, save_json  # noqa: E402

COPY_S = 6.0
MATMUL_S = 6.0
COPY_MIB = 256


def _nvml_index_of_cuda0(sampler: Sampler) -> int:
    """NVML and CUDA may number GPUs differently (CUDA_VISIBLE_DEVICES): match by UUID."""
    want = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
    for info in sampler.gpus:
        if str(info.uuid).lower().removeprefix("gpu-") == want:
            return info.index
    assert len(sampler.gpus) == 1, f"no NVML GPU has cuda:0's UUID {want}"
    return sampler.gpus[0].index


def _counter_directly(index: int) -> int:
    """The energy counter through pynvml itself, not through gpunb's session."""
    import pynvml

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(index)))


def _tick_ms(sampler: Sampler, read_links: bool, n: int = 20) -> float:
    sampler.read_links = read_links
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sampler.tick()
        times.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.05)
    sampler.read_links = True
    return statistics.median(times)


def test_pcie_chart_and_energy_since_start_during_copies_and_matmuls():
    sampler = Sampler(default_session(), hz=10, process_refresh_s=5.0)
    assert sampler.status.ok, sampler.status.cause
    idx = _nvml_index_of_cuda0(sampler)
    dev = torch.device("cuda", 0)
    n_bytes = COPY_MIB * 2**20
    pinned = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    dst = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.cuda.synchronize()

    sampler.tick()  # the first reading: energy since the start counts from here
    first = _counter_directly(idx)
    t0 = time.monotonic()
    sampler.start()
    copied = 0
    try:
        marks = {"copies from": sampler.now_s()}
        end = time.monotonic() + COPY_S
        while time.monotonic() < end:
            for _ in range(8):
                dst.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            copied += 8 * n_bytes
        marks["matmuls from"] = sampler.now_s()
        end = time.monotonic() + MATMUL_S
        while time.monotonic() < end:
            for _ in range(20):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
        marks["end"] = sampler.now_s()
    finally:
        sampler.stop()
    copy_gbs = copied / COPY_S / 1e9
    sampler.tick()  # the last reading, then the counter directly
    last = _counter_directly(idx)
    seconds = time.monotonic() - t0

    cols = sampler.samples()
    rx = [v for v in cols[f"gpu{idx}_pcie_rx_gbs"] if v is not None]
    energy = sampler.traffic.energy(idx)
    direct_j = (last - first) / 1000.0
    window = sampler.window(120)
    frame = monitor_html(window)
    text = monitor_text(window)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "monitor_links_frame.html").write_text(frame)
    on_ms, off_ms = _tick_ms(sampler, True), _tick_ms(sampler, False)
    g = next(x for x in window.gpus if x.index == idx)
    summary = {
        "gpu": torch.cuda.get_device_name(0),
        "seconds": seconds,
        "hz": sampler.hz,
        "ticks": sampler.ticks,
        "copy_loop_gbs_timed_by_host": copy_gbs,
        "pcie_rx_gbs_max": max(rx, default=None),
        "pcie_rx_readings": len(rx),
        "pcie_rx_limit": {"gbs": g.links.pcie_rx.gbs, "source": g.links.pcie_rx.source} if g.links else None,
        "nvlink_links": g.links.nvlink_links if g.links else None,
        "energy_monitor_j": energy.joules if energy else None,
        "energy_source": energy.source if energy else None,
        "energy_counter_direct_j": direct_j,
        "energy_ratio": (energy.joules / direct_j) if energy and direct_j else None,
        "tick_ms_median_with_links": on_ms,
        "tick_ms_median_without_links": off_ms,
        "marks_s": marks,
        "text_form": text,
        "notes": list(sampler.notes),
    }
    save_json("monitor_links_gpu.json", summary)
    print(summary)

    assert rx and max(rx) >= 20.0, summary
    assert energy is not None and energy.source == "energy counter", summary
    assert direct_j > 0 and abs(energy.joules / direct_j - 1) <= 0.02, summary
    assert "PCIe host→GPU (GB/s)" in frame and "PCIe GPU→host (GB/s)" in frame, summary
    assert "gpunb-energy" in frame and "Energy:" in text and "PCIe in" in text, summary
    if g.links is not None and g.links.nvlink is None:
        assert "NVLink" not in frame and "NVLink" not in text, summary
    assert seconds < 120, summary
