"""Record what one GPU says about energy and link traffic, for gpunb's fake NVML (issue 23).

Run on the GPU machine (never in CI): ``python3 scripts/record_energy_links.py --out DIR``.
Writes ``DIR/energy_links_record.json``: NVML read every ~20 ms on GPU 0 through five phases
(idle, a bf16 matmul burst, pinned host->device copies, device->host copies, idle), each sample
with the total-energy counter (mJ since driver load), power (mW), PCIe throughput (KB/s, TX and
RX), and the PCIe and NVLink field values where the GPU answers them; every phase names the bytes
it copied and the FLOPs it ran, so a reader can check the readings against the work. Errors are
kept as strings ("not supported" is a finding, not a failure).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

FIELD_NAMES = ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
               "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX")


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # an NVML error is a reading too
        return f"error: {exc}"


def sample(pynvml, handle, fields):
    out = {"t": time.monotonic(),
           "energy_mj": _call(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle),
           "power_mw": _call(pynvml.nvmlDeviceGetPowerUsage, handle),
           "pcie_tx_kbs": _call(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES),
           "pcie_rx_kbs": _call(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)}
    if fields:
        values = _call(pynvml.nvmlDeviceGetFieldValues, handle, list(fields.values()))
        if isinstance(values, str):
            out["fields"] = values
        else:
            out["fields"] = {name: (v.value.ullVal if v.nvmlReturn == 0 else f"nvml return {v.nvmlReturn}")
                             for name, v in zip(fields, values)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--every-s", type=float, default=0.02)
    args = parser.parse_args()
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = {n: getattr(pynvml, n) for n in FIELD_NAMES if hasattr(pynvml, n)}
    record = {"gpu": _call(pynvml.nvmlDeviceGetName, handle), "driver": _call(pynvml.nvmlSystemGetDriverVersion),
              "fields": fields, "every_s": args.every_s, "phases": [], "samples": []}
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            record["samples"].append(sample(pynvml, handle, fields))
            stop.wait(args.every_s)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()  # 1 GiB
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()

    def phase(name: str, seconds: float, work=None, **per_call) -> None:
        t0 = time.monotonic()
        calls = 0
        while time.monotonic() - t0 < seconds:
            if work is None:
                time.sleep(0.05)
                continue
            work()
            calls += 1
            if calls % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        record["phases"].append({"name": name, "t0": t0, "t1": time.monotonic(), "calls": calls,
                                 **{k: v * calls for k, v in per_call.items()}})

    phase("idle", 1.5)
    phase("bf16 matmul 8192", 3.0, lambda: a @ b, flops=2 * 8192**3)
    phase("pinned host->device 1 GiB", 2.0, lambda: dev.copy_(host, non_blocking=True), bytes=1 << 30)
    phase("device->pinned host 1 GiB", 1.0, lambda: host.copy_(dev, non_blocking=True), bytes=1 << 30)
    phase("idle after", 1.5)
    stop.set()
    thread.join()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "energy_links_record.json")
    with open(path, "w") as f:
        json.dump(record, f)
    energies = [s["energy_mj"] for s in record["samples"] if isinstance(s["energy_mj"], int)]
    changes = sum(1 for x, y in itertools.pairwise(energies) if y != x)
    span = record["samples"][-1]["t"] - record["samples"][0]["t"]
    print(f"{len(record['samples'])} samples over {span:.1f} s; energy counter changed {changes} times "
          f"({changes / span:.1f}/s); {(energies[-1] - energies[0]) / 1000:.0f} J; wrote {path}")


if __name__ == "__main__":
    main()
