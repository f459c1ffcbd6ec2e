"""Whether the PCI bus holds an NVIDIA GPU, read from sysfs without any driver.

NVML needs the driver; the bus does not. This tells "a laptop with no NVIDIA GPU" apart
from "an NVIDIA GPU whose driver is missing", which need different fixes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
# PCI base class 0x03 is a display controller (VGA 0x0300, 3D 0x0302: data-centre GPUs)
_DISPLAY_CLASS = "0x03"


# Tests (and their subprocesses) that replay a fake NVML set what the bus holds: "0" or "1".
FAKE_ENV = "GPUNB_FAKE_PCI_NVIDIA"


def nvidia_gpu_on_bus(root: Path = Path("/sys/bus/pci/devices"),
                      environ: Mapping[str, str] | None = None) -> bool | None:
    """True/False when sysfs could be read, None when it could not (not Linux, no /sys)."""
    fake = (os.environ if environ is None else environ).get(FAKE_ENV)
    if fake in ("0", "1"):
        return fake == "1"
    try:
        devices = list(root.iterdir())
    except OSError:
        return None
    for device in devices:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(_DISPLAY_CLASS):
            return True
    return False
