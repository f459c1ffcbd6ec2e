"""Which CUDA build of PyTorch to install for this driver, as a command to copy.

PyTorch publishes one wheel index per CUDA version at ``https://download.pytorch.org/whl/cuXYZ``
(pytorch.org/get-started/locally and /previous-versions list them per release: cu118,
cu121, cu124, cu126, cu128, cu129, cu130 across 2.1-2.10). A wheel carries its own CUDA
runtime, which runs on any driver that supports that CUDA version or a newer one, so the
right index is the newest one not above what the driver supports (NVML's
``nvmlSystemGetCudaDriverVersion``, also shown by ``nvidia-smi`` and ``%gpucheck``).
"""

from __future__ import annotations

import re

INSTALL_DOC = "https://pytorch.org/get-started/locally/"
WHEEL_CUDA: tuple[tuple[int, int], ...] = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))


def _version(text: object) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", str(text)) if text is not None else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def wheel_tag(driver_cuda: object) -> str | None:
    """``cu130`` for a driver that supports CUDA 13.0; None when the driver's CUDA
    version is unknown or older than every published wheel."""
    have = _version(driver_cuda)
    if have is None:
        return None
    fitting = [v for v in WHEEL_CUDA if v <= have]
    if not fitting:
        return None
    major, minor = fitting[-1]
    return f"cu{major}{minor}"


def install_command(driver_cuda: object) -> str:
    """The pip command for the CUDA build this driver runs, or where to look it up."""
    tag = wheel_tag(driver_cuda)
    if tag is None:
        return f"pip install --force-reinstall torch  # pick the CUDA build for your driver at {INSTALL_DOC}"
    return f"pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/{tag}"
