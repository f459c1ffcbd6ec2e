"""Peak dense throughput and memory bandwidth per GPU model, to judge what was measured.

Figures are NVIDIA's datasheet numbers for dense math (without 2:4 sparsity), TFLOP/s, and
the memory bandwidth, GB/s. Sources: H200 datasheet (nvidia.com/en-us/data-center/h200), H100
datasheet (nvidia.com/en-us/data-center/h100), A100 datasheet (nvidia.com/en-us/data-center/a100),
L40S, L4 and A10 datasheets (nvidia.com/en-us/data-center/...), RTX 4090 from the Ada
architecture whitepaper (appendix, FP32-accumulate figures). Sparsity figures are twice these.
FP16 tensor-core rates equal the bf16 ones on every GPU listed; FP8 exists from Hopper/Ada on.
"""

from __future__ import annotations

from dataclasses import dataclass

# The precisions a training step's FLOPs are sorted into (analysis/steps/flop_count.py).
PRECISIONS = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64", "other")


@dataclass(frozen=True)
class PeakThroughput:
    model: str
    bf16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float
    memory_gbps: float | None = None  # HBM/GDDR bandwidth
    fp8_tflops: float | None = None

    def tflops(self, precision: str) -> float | None:
        """The datasheet peak for FLOPs of ``precision`` (one of :data:`PRECISIONS`), None when
        the datasheet has no figure (fp64 tensor cores, integer math)."""
        if precision in ("bf16", "fp16"):
            return self.bf16_tflops
        return {"tf32": self.tf32_tflops, "fp32": self.fp32_tflops, "fp8": self.fp8_tflops}.get(precision)


# Most specific names first: matching is by substring of the NVML/CUDA device name
# ("NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA A100-SXM4-40GB" the 40 GB one).
_PEAKS: tuple[PeakThroughput, ...] = (
    PeakThroughput("H200 NVL", 835.5, 417.5, 60.0, 4800.0, 1670.5),
    PeakThroughput("H200", 989.5, 494.5, 67.0, 4800.0, 1979.0),  # SXM
    PeakThroughput("H100 NVL", 835.5, 417.5, 60.0, 3900.0, 1670.5),
    PeakThroughput("H100 PCIe", 756.5, 378.0, 51.0, 2000.0, 1513.0),
    PeakThroughput("H100", 989.5, 494.5, 67.0, 3350.0, 1979.0),  # SXM
    PeakThroughput("A100-SXM4-80GB", 312.0, 156.0, 19.5, 2039.0),
    PeakThroughput("A100 80GB PCIe", 312.0, 156.0, 19.5, 1935.0),
    PeakThroughput("A100", 312.0, 156.0, 19.5, 1555.0),  # 40 GB
    PeakThroughput("L40S", 362.05, 183.0, 91.6, 864.0, 733.0),
    PeakThroughput("L4", 121.0, 60.0, 30.3, 300.0, 242.5),
    PeakThroughput("A10", 125.0, 62.5, 31.2, 600.0),
    PeakThroughput("RTX 4090", 165.2, 82.6, 82.6, 1008.0),
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
