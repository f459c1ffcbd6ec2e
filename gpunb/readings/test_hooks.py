"""Which of gpunb's test stand-ins answer in this process, so every figure they produce says so.

The ``GPUNB_FAKE_*`` variables swap the driver for a recording (``GPUNB_FAKE_NVML``), list
processes from a file (``GPUNB_FAKE_NVML_PROCESSES``), start the replay later
(``GPUNB_FAKE_NVML_FROM_S``) and stand in for the NVIDIA device files
(``GPUNB_FAKE_NVIDIA_DEVICES``). They are test hooks, but they work in production too (a
notebook, a server): whoever sets them, or leaves them set, makes gpunb show a recording as
this machine. So the JSON API, the metrics and the views mark such figures ``fake``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

FAKE_VARIABLES = ("GPUNB_FAKE_NVML", "GPUNB_FAKE_NVML_PROCESSES", "GPUNB_FAKE_NVML_FROM_S", "GPUNB_FAKE_NVIDIA_DEVICES")


def active_fakes(environ: Mapping[str, str] | None = None, *, nvml_fake: bool = False) -> tuple[str, ...]:
    """The test stand-ins in use: the ``GPUNB_FAKE_*`` variables set, and "fake NVML" when the
    NVML library is gpunb's recording (set by a test, not by a variable)."""
    env = os.environ if environ is None else environ
    names = [name for name in FAKE_VARIABLES if env.get(name)]
    if nvml_fake and "GPUNB_FAKE_NVML" not in names:
        names.insert(0, "fake NVML")
    return tuple(names)


def fake_note(fakes: tuple[str, ...]) -> str:
    """One sentence for a view ('' when nothing is fake)."""
    if not fakes:
        return ""
    return (f"fake: these figures come from gpunb's test stand-ins ({', '.join(fakes)}), a recording, not this "
            "machine's GPUs; unset the GPUNB_FAKE_* variables and restart to read the real ones")
