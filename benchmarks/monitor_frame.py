"""What one live-monitor frame costs: its size (sent to the frontend up to 4 times a second) and
the time to draw it on the sampler thread, eight fake H200s at 2 Hz with a full 2-minute window.

    python benchmarks/monitor_frame.py            # prints: live: frame 170 KiB, draw median 6.2 ms

Run it against two checkouts side by side (PYTHONPATH=<checkout>) to compare layouts.
"""

from __future__ import annotations

import inspect
import statistics
import time

from gpunb.analysis.monitor.sampler import Sampler
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario
from gpunb.views.sparkline import SparkPanel


def main(frames: int = 30) -> None:
    try:
        from gpunb.views.monitor_layout import panel_html
    except ImportError:  # a checkout before the layout moved out of sparkline.py
        panel_html = None
    t = [0.0]
    sampler = Sampler(NvmlSession(scenario("eight-gpus", clock=lambda: t[0])), clock=lambda: t[0], hz=2)
    for _ in range(400):  # 200 s of readings: the 2-minute window is full
        sampler.tick()
        t[0] += 0.5
    panel = SparkPanel(window_s=120, hz=2, gpus=sampler.gpu_series(), ram_total_mib=24000.0, cpu_count=2)
    panel.feed(*sampler.rows_since(0))
    args = (sampler.gpu_series(),)
    kw = {"nvml": sampler.status, "gpu_count": len(sampler.gpus), "caption_text": "x"}
    # the live frame as drawn by default and with each GPU's panels shown (the "Each GPU" button)
    variants = {"live": {}}
    if panel_html is not None and "per_gpu" in inspect.signature(panel_html).parameters:
        variants = {"live": {"per_gpu": "button"}, "each GPU shown": {"per_gpu": "open"}}
    for name, extra in variants.items():
        times, html = [], ""
        for _ in range(frames):
            t0 = time.perf_counter()
            html = panel_html(panel, *args, **kw, **extra) if panel_html else panel.html(*args, **kw)
            times.append(time.perf_counter() - t0)
        print(f"{name}: frame {len(html) / 1024:.0f} KiB, draw median {1000 * statistics.median(times):.1f} ms")


if __name__ == "__main__":
    main()
