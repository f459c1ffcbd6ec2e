"""One statement of the machine: which of a few states it is in, said once in one sentence
with one severity and the fix that fits that state.

Every surface that has to say "no GPU" (``%gpucheck``, ``%gpumonitor``, ``%gpuenergy``,
``%gpumem``, ``%%gpumem --trace``, ``gpunb check``) asks :func:`state_of` instead of
wording NVML's error itself, so a laptop is never told to install a driver, and a CPU
build of torch on a GPU machine is told the exact install command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpunb.analysis.torch_wheels import install_command
from gpunb.readings.nvml import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, TIMEOUT, NvmlSession, NvmlStatus
from gpunb.readings.torch_build import TorchBuild

State = Literal["no_gpu", "no_driver", "nvml_slow", "no_torch", "cpu_torch", "gpus"]
Severity = Literal["info", "warn", "fail"]
STATES: tuple[State, ...] = ("no_gpu", "no_driver", "nvml_slow", "no_torch", "cpu_torch", "gpus")


@dataclass(frozen=True)
class MachineStatement:
    state: State
    sentence: str  # the finding, one sentence
    severity: Severity  # info: nothing to do; warn: works, but not on the GPU; fail: the GPU is unusable
    fix: str = ""  # "" when there is nothing to fix

    @property
    def has_gpu(self) -> bool:
        return self.state in ("gpus", "cpu_torch", "no_torch", "nvml_slow")

    def text(self) -> str:
        """The sentence and its fix, as one line."""
        return f"{self.sentence} {self.fix}".strip()


NO_GPU = MachineStatement(
    "no_gpu", "No NVIDIA GPU on this machine — expected on a laptop; the GPU readings are skipped.", "info")
_NO_DRIVER_FIX = ("Install the NVIDIA driver until `nvidia-smi` lists the GPU; in a container, start it with "
                  "`--gpus all` (the NVIDIA container toolkit).")
_NOT_LOADED_FIX = "Load the driver (`sudo modprobe nvidia`) or reboot after the driver install; then run `nvidia-smi`."


def state_of(nvml: NvmlStatus, gpu_count: int | None, torch: TorchBuild,
             nvidia_on_bus: bool | None, driver_cuda: object = None) -> MachineStatement:
    """Decide the machine's state from what NVML, the PCI bus and torch's build say."""
    if not nvml.ok:
        if nvml.code == TIMEOUT:
            return MachineStatement("nvml_slow", "The NVIDIA driver is slow to answer (NVML timed out); "
                                    "GPU readings may be missing for a while.", "warn", nvml.fix)
        if nvml.code in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED) and not nvidia_on_bus:
            # no driver library and no NVIDIA device on the bus (or no way to look): a laptop
            return NO_GPU
        if nvml.code == DRIVER_NOT_LOADED:
            return MachineStatement("no_driver", "This machine has an NVIDIA GPU, but its driver is not loaded.",
                                    "fail", _NOT_LOADED_FIX)
        if nvml.code == LIBRARY_NOT_FOUND:
            return MachineStatement("no_driver", "This machine has an NVIDIA GPU, but no NVIDIA driver is "
                                    "installed.", "fail", _NO_DRIVER_FIX)
        return MachineStatement("no_driver", f"The NVIDIA driver is in trouble: {nvml.cause}", "fail", nvml.fix)
    if not gpu_count:
        return MachineStatement("no_gpu", "The NVIDIA driver is loaded but sees no GPU.", "warn",
                                "Run `nvidia-smi`; in a container, start it with `--gpus all`; "
                                "check CUDA_VISIBLE_DEVICES.")
    gpus = f"{gpu_count} NVIDIA GPU{'s' if gpu_count != 1 else ''}"
    if not torch.installed:
        return MachineStatement("no_torch", "torch is not installed", "warn",
                                f"Install the CUDA build of torch this driver runs: `{install_command(driver_cuda)}`.")
    if not torch.cuda and not torch.hip:
        return MachineStatement("cpu_torch", f"torch {torch.version} is a CPU-only build: every model trains on "
                                "the CPU", "fail", f"Reinstall the CUDA build your driver (CUDA {driver_cuda}) runs: "
                                f"`{install_command(driver_cuda)}`.")
    return MachineStatement("gpus", f"{gpus} visible.", "info")


def read_state(nvml: NvmlStatus, gpu_count: int | None, driver_cuda: object = None) -> MachineStatement:
    """:func:`state_of` with the bus and torch's build read now (no torch import, no CUDA)."""
    from gpunb.readings import pci
    from gpunb.readings.torch_build import read_torch_build

    return state_of(nvml, gpu_count, read_torch_build(), pci.nvidia_gpu_on_bus(), driver_cuda)


def without_gpu(nvml: NvmlStatus, gpu_count: int | None = None) -> str:
    """What a magic that found no GPU to read says: the machine's one sentence and its fix
    (a laptop: the sentence alone; a GPU without its driver: how to install or load it)."""
    return read_state(nvml, gpu_count).text()


def machine_of(session: NvmlSession) -> MachineStatement:
    """The machine's statement with the driver read from ``session`` now: its GPU count and
    the CUDA version it runs (which the install command for torch depends on)."""
    from gpunb.readings.gpu import read_driver

    driver = read_driver(session)
    return read_state(driver.nvml, driver.gpu_count if driver.nvml.ok else None, driver.cuda_driver_version)
