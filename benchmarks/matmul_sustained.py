"""Why %gpucheck's bf16 figure (the MFU reference) is a sustained one: bf16 8192² matmuls
back to back for a few seconds, TF32 off, their rate per 50 ms window beside NVML's SM clock
and power draw, and the probe's own two figures (ten calls, and ~150 ms of calls) taken in
the same process. Usage, on a GPU machine:

    python benchmarks/matmul_sustained.py --out DIR [--seconds 3]

Writes DIR/matmul_sustained.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import pynvml
    import torch

    from gpunb.readings import cuda_probe_script as probe
    from gpunb.readings import torch_state

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return
    dev = torch.device("cuda", 0)
    pynvml.nvmlInit()
    n = 8192
    flop = 2 * n**3
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    handle = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + str(torch_state.device_uuid(torch, 0)))  # a whole GPU
    clock = probe.GpuClock(torch, dev)
    time.sleep(1.0)  # start from an idle GPU, as %gpucheck does
    probe_figures = probe.matmul(torch, dev, clock, busy=False)
    time.sleep(1.0)

    windows = []
    per_window = max(1, round(50.0 / (flop / (probe_figures["bf16_burst_tflops"] * 1e12) * 1e3)))
    t_end = time.perf_counter() + args.seconds
    while time.perf_counter() < t_end:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_window):
            a @ b
        end.record()
        end.synchronize()  # a gap of a launch between windows: negligible beside 50 ms
        ms = start.elapsed_time(end)
        windows.append({"t_s": round(args.seconds - (t_end - time.perf_counter()), 3),
                        "tflops": round(flop * per_window / (ms * 1e-3) / 1e12, 1),
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "power_w": round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)})
    first, last = windows[0], windows[len(windows) // 2:]
    result = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "probe": probe_figures,
              "first_window_tflops": first["tflops"],
              "second_half_median_tflops": statistics.median(w["tflops"] for w in last),
              "second_half_median_sm_mhz": statistics.median(w["sm_mhz"] for w in last),
              "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
              "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000, "windows": windows}
    print(f"probe: ten calls {probe_figures['bf16_burst_tflops']:.0f} TFLOP/s, "
          f"{probe_figures['bf16_sustained_calls']} calls {probe_figures['bf16_tflops']:.0f} TFLOP/s")
    print(f"{'t s':>6} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6}")
    for w in windows[:: max(1, len(windows) // 20)]:
        print(f"{w['t_s']:6.2f} {w['tflops']:8.1f} {w['sm_mhz']:7d} {w['power_w']:6.1f}")
    print(f"second half: {result['second_half_median_tflops']} TFLOP/s at {result['second_half_median_sm_mhz']} MHz "
          f"(max {result['max_sm_mhz']} MHz, power limit {result['power_limit_w']} W)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matmul_sustained.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
