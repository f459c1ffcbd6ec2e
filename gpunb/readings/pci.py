"""Whether the PCI bus holds an NVIDIA GPU, read from sysfs without any driver.

NVML needs the driver; the bus does not. This tells "a laptop with no NVIDIA GPU" apart
from "an NVIDIA GPU whose driver is missing", which need different fixes.
"""

from __future__ import annotations

from pathlib import Path

NVIDIA_VENDOR = "0x10de"
# PCI base class 0x03 is a display controller (VGA 0x0300, 3D 0x0302: data-centre GPUs)
_DISPLAY_CLASS = "0x03"


def nvidia_gpu_on_bus(root: Path = Path("/sys/bus/pci/devices")) -> bool | None:
    """True/False when sysfs could be read, None when it could not (not Linux, no /sys)."""
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
