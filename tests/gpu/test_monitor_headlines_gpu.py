"""Every headline number is what its chart shows, on the real GPUs while a matmul loop runs: the
same checks as tests/test_monitor_headlines.py (each panel's number and max recomputed from the
sampler's record with the aggregate the panel names, its unit, its axis, every series drawn),
on frames taken from a real Sampler over NVML, at whatever number of GPUs the machine has.

    python -m pytest -m gpu tests/gpu/test_monitor_headlines_gpu.py
"""

from __future__ import annotations

import re
import threading
import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (this test runs on the GPU test machine)", allow_module_level=True)

from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.readings.nvml import default_session  # noqa: E402
from gpunb.views.monitor_layout import monitor_html  # noqa: E402
from tests.test_monitor_headlines import WINDOW_S, close, column, expected, panels, shown  # noqa: E402


def test_headlines_match_their_charts_on_the_real_gpus():
    sampler = Sampler(default_session())
    stop = threading.Event()

    def work():
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    checked = 0
    try:
        for i in range(24):  # 12 s at 2 Hz, a frame every second
            sampler.tick()
            time.sleep(0.5)
            if i % 2:
                continue
            window = sampler.window(WINDOW_S)
            for panel in panels(monitor_html(window, state="stopped")):
                now, peak = expected(window, panel)
                big, digits = shown(panel["big"])
                assert (big is None) == (now is None), panel
                if big is not None:
                    assert close(big, now, digits), (panel["title"], panel["big"], now)
                shown_peak, peak_digits = shown(panel["peak"])
                if shown_peak is not None and peak is not None:
                    assert close(shown_peak, peak, peak_digits), (panel["title"], shown_peak, peak)
                    if panel["axis"] is not None:
                        assert shown_peak <= panel["axis"] + 10 ** -peak_digits, panel["title"]
                if not (panel["title"].startswith("memory") and len(panel["keys"]) == 1):
                    with_readings = sum(1 for k in panel["keys"] if any(v is not None for v in column(window, k)))
                    drawn = [d for d in panel["lines"] if re.search(r"[ML][\d.]+,[\d.]+ L", d)]
                    assert len(drawn) == with_readings, panel["title"]
                checked += 1
    finally:
        stop.set()
        worker.join(timeout=30)
        sampler.stop()
    assert checked > 10
