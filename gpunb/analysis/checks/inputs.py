"""Everything the checks look at, gathered once so each check is a pure function of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunb.readings.allreduce import AllReduceRun
from gpunb.readings.cuda_probe import ProbeResult
from gpunb.readings.devices import DeviceMap, GpuOwnership
from gpunb.readings.gpu import GpuInfo, GpuProcess, GpuSample, GpuSnapshot
from gpunb.readings.host import HostFacts
from gpunb.readings.links import LinkMap
from gpunb.readings.nvml import Unavailable
from gpunb.readings.torch_build import KernelTorchState, TorchBuild
from gpunb.readings.visible_devices import VisibleDevices


@dataclass
class CheckInputs:
    environ: Mapping[str, str]
    snapshot: GpuSnapshot
    host: HostFacts
    torch: TorchBuild
    kernel_torch: KernelTorchState | None  # None unless the user imported torch in this process
    in_kernel: bool  # running inside a notebook/IPython kernel
    devices: DeviceMap  # cuda:N <-> NVML GPU, from the environment (and torch, once CUDA is up here)
    selected: tuple[int, ...]  # NVML indices of the GPUs being checked
    ownership: tuple[GpuOwnership, ...] = ()  # per NVML GPU: this kernel's processes and everyone else's
    probe: ProbeResult | None = None  # None with --quick
    probe_devices: tuple[int, ...] = ()  # CUDA ordinals measured by the probe, matching ``selected``
    frameworks: dict[str, Any] = field(default_factory=dict)  # "jax"/"tensorflow" -> report
    quick: bool = False
    deep: bool = False  # the slow multi-GPU measurements (the NCCL all-reduce)
    links: LinkMap | None = None  # NVLink and PCIe between the GPUs (NVML)
    links_error: str = ""  # why reading them failed (a gpunb bug; the other checks still ran)
    allreduce: AllReduceRun | None = None  # None unless deep, with two or more GPUs and a CUDA torch
    require_gpu: bool = False  # a machine without an NVIDIA GPU fails the driver check instead of skipping it

    @property
    def visible(self) -> VisibleDevices:
        return self.devices.visible

    @property
    def gpus(self) -> list[GpuInfo]:
        return [g for g in self.snapshot.gpus if g.index in self.selected]

    @property
    def has_gpu(self) -> bool:
        return bool(self.snapshot.gpus)

    def sample(self, index: int) -> GpuSample:
        return self.snapshot.samples[index]

    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unavailable:
        return self.snapshot.processes[index]
