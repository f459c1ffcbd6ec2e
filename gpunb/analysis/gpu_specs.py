"""Peak dense throughput per GPU model, to judge what the smoke test measured.

Figures are NVIDIA's datasheet numbers for dense math (without 2:4 sparsity), TFLOP/s.
Sources: H200 datasheet (nvidia.com/en-us/data-center/h200), H100 datasheet
(nvidia.com/en-us/data-center/h100), A100 datasheet (nvidia.com/en-us/data-center/a100),
L40S, L4 and A10 datasheets (nvidia.com/en-us/data-center/...), RTX 4090 from the Ada
architecture whitepaper (appendix, FP32-accumulate figures). Sparsity figures are twice these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeakThroughput:
    model: str
    bf16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float


# Most specific names first: matching is by substring of the NVML/CUDA device name.
_PEAKS: tuple[PeakThroughput, ...] = (
    PeakThroughput("H200 NVL", 835.5, 417.5, 60.0),
    PeakThroughput("H200", 989.5, 494.5, 67.0),  # SXM
    PeakThroughput("H100 NVL", 835.5, 417.5, 60.0),
    PeakThroughput("H100 PCIe", 756.5, 378.0, 51.0),
    PeakThroughput("H100", 989.5, 494.5, 67.0),  # SXM
    PeakThroughput("A100", 312.0, 156.0, 19.5),
    PeakThroughput("L40S", 362.05, 183.0, 91.6),
    PeakThroughput("L4", 121.0, 60.0, 30.3),
    PeakThroughput("A10", 125.0, 62.5, 31.2),
    PeakThroughput("RTX 4090", 165.2, 82.6, 82.6),
)


def peak_for(name: str) -> PeakThroughput | None:
    for peak in _PEAKS:
        if peak.model in name:
            return peak
    return None


def pcie_gbps(generation: int, width: int) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s (PCI-SIG per-lane rates after encoding:
    gen1/2 8b/10b, gen3-5 128b/130b; gen6 ~7.56 GB/s per lane with FLIT encoding)."""
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}.get(generation)
    return per_lane * width if per_lane else None
