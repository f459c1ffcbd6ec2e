"""The sampler beside a real training loop on the GPU: the series must show the memory
ramp and the utilization. Writes the series, a summary and a figure to ``$GPUNB_RESULTS``.

Needs CUDA (skips cleanly without it). No IPython or widgets: the sampler is the part
that talks to the hardware; the widget drawing it is tested in the browser test.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (this test runs on the GPU test machine)", allow_module_level=True)

from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.readings.nvml import default_session  # noqa: E402

MIB = 2**20
BATCHES = (1024, 4096, 8192, 16384)  # a memory ramp: each phase needs more activations
PHASE_S = 1.6


def _results_dir() -> Path:
    path = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _nvml_index_of_cuda0(sampler: Sampler) -> int:
    """NVML and CUDA may number GPUs differently (CUDA_VISIBLE_DEVICES): match by UUID."""
    want = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
    for info in sampler.gpus:
        if str(info.uuid).lower().removeprefix("gpu-") == want:
            return info.index
    assert len(sampler.gpus) == 1, f"no NVML GPU has cuda:0's UUID {want}"
    return sampler.gpus[0].index


def _figure(cols: dict, idx: int, marks: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = cols["t_s"]
    fig, axes = plt.subplots(3, 1, figsize=(8, 6), sharex=True)
    axes[0].plot(t, [v / 1024 if v is not None else None for v in cols[f"gpu{idx}_mem_used_mib"]], label="used")
    axes[0].plot(t, [v / 1024 if v is not None else None for v in cols[f"gpu{idx}_mem_own_mib"]], label="this process")
    axes[0].set_ylabel("memory GiB")
    axes[0].legend()
    axes[1].plot(t, cols[f"gpu{idx}_util_pct"])
    axes[1].set_ylabel("util %")
    axes[2].plot(t, cols[f"gpu{idx}_power_w"])
    axes[2].set_ylabel("power W")
    axes[2].set_xlabel("s")
    for name, x in marks.items():
        for ax in axes:
            ax.axvline(x, color="grey", lw=0.5)
        axes[0].annotate(name, (x, 0), fontsize=7, rotation=90)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def test_sampler_shows_memory_ramp_and_utilization_of_a_training_loop():
    sampler = Sampler(default_session(), hz=10, process_refresh_s=1.0)
    assert sampler.status.ok, sampler.status.cause
    idx = _nvml_index_of_cuda0(sampler)
    sampler.start()
    marks = {}
    peaks = {}
    try:
        time.sleep(1.0)
        marks["start"] = sampler.now_s()
        torch.manual_seed(0)
        width = 8192
        model = torch.nn.Sequential(
            *[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
        ).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for batch in BATCHES:
            marks[f"batch {batch}"] = sampler.now_s()
            x = torch.randn(batch, width, device="cuda")
            t_end = time.monotonic() + PHASE_S
            while time.monotonic() < t_end:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x).float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()  # once per step here: keeps the phases honest in time
            peaks[batch] = torch.cuda.max_memory_reserved() / MIB
        marks["end"] = sampler.now_s()
        time.sleep(1.2)  # one more process-list refresh while the memory is still held
    finally:
        sampler.stop()
    reserved_mib = torch.cuda.memory_reserved() / MIB
    cols = sampler.samples()
    t = cols["t_s"]
    used = cols[f"gpu{idx}_mem_used_mib"]
    own = cols[f"gpu{idx}_mem_own_mib"]
    util = cols[f"gpu{idx}_util_pct"]
    power = cols[f"gpu{idx}_power_w"]

    def during(values, a, b):
        return [v for ti, v in zip(t, values) if a <= ti <= b and v is not None]

    idle_used = statistics.median(during(used, 0, marks["start"]))
    phase_used = []
    names = list(marks)
    for i in range(len(BATCHES)):
        a, b = marks[names[i + 1]], marks[names[i + 2]]
        phase_used.append(max(during(used, a, b)))
    train_util = during(util, marks[f"batch {BATCHES[1]}"], marks["end"])
    summary = {
        "device": torch.cuda.get_device_name(0),
        "nvml_index": idx,
        "ticks": sampler.ticks,
        "hz": sampler.hz,
        "idle_used_mib": idle_used,
        "phase_max_used_mib": dict(zip(map(str, BATCHES), phase_used)),
        "torch_max_reserved_mib_by_phase": {str(k): v for k, v in peaks.items()},
        "own_mib_last": next(v for v in reversed(own) if v is not None),
        "torch_reserved_mib_at_end": reserved_mib,
        "util_pct_median_training": statistics.median(train_util),
        "util_pct_max": max(v for v in util if v is not None),
        "power_w_idle_median": statistics.median(during(power, 0, marks["start"]) or [0]),
        "power_w_max_training": max(during(power, marks["start"], marks["end"]) or [0]),
        "sampler_cpu_s_per_s": sampler.thread_cpu_s / sampler.thread_wall_s,
        "notes": list(sampler.notes),
        "marks_s": marks,
    }
    out = _results_dir()
    (out / "monitor_gpu_series.json").write_text(json.dumps({"summary": summary, "columns": cols}))
    (out / "monitor_gpu_summary.json").write_text(json.dumps(summary, indent=1))
    _figure(cols, idx, marks, out / "monitor_gpu.png")
    from gpunb.views.monitor_layout import monitor_html

    (out / "monitor_gpu.html").write_text(monitor_html(sampler.window(t[-1] + 1), state="stopped"))
    print(json.dumps(summary, indent=1))

    # The memory ramp: model + optimizer state (~4 GiB) appear, then larger batches need
    # more (PyTorch's cache never gives memory back by itself, so "used" never drops;
    # a small step may be served from cached blocks, the largest cannot: ~3 GiB more).
    assert phase_used[0] - idle_used > 3 * 1024, summary
    assert all(b >= a - 1 for a, b in itertools.pairwise(phase_used)), summary
    assert phase_used[-1] - phase_used[0] > 1024, summary
    # NVML's per-process figure for this kernel covers what PyTorch reserved (+ context).
    assert summary["own_mib_last"] >= reserved_mib, summary
    # A matmul-heavy loop keeps the GPU busy.
    assert summary["util_pct_median_training"] > 50, summary
    assert summary["power_w_max_training"] > summary["power_w_idle_median"], summary
    assert not any("failed" in n for n in sampler.notes), summary
