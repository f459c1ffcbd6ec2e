"""Common GPUs and the memory a training process can use on each.

``total_mib`` is the memory the driver reports (``nvidia-smi``'s "Total", NVML's
``memory.total``), which is less than the datasheet's round number (ECC and the driver's own
reservations). Sources: the H200's is measured here (``benchmarks/results/
h200x2_batch_fit_zoo_run1.json``: 143771 MiB); the others are the totals ``nvidia-smi`` prints on
those cards as commonly reported by their users and cloud providers' documentation, checked
against the datasheet capacities (NVIDIA's product pages: T4 16 GB, V100 16/32 GB, A10 and L4
24 GB, A100 40/80 GB, L40S 48 GB, H100 80 GB, H200 141 GB, RTX 3090/4090 24 GB).

What a training process can use is that total less what the CUDA context, cuBLAS and cuDNN take
outside torch's allocator (``calibration.CONTEXT_BYTES``, measured on the H200: a GPU with fewer
multiprocessors takes less, so the usable figure errs low).

Any other GPU is given by its memory in GiB (``24``, ``"24GiB"``, ``"24 GB"``: read as GiB, what
the marketing "GB" of a GPU means).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpunb.analysis.plan.calibration import CONTEXT_BYTES

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    usable_bytes: int  # for torch's allocator: the total less the context
    source: str


# name, total MiB, the names it is known by (lower case, without spaces); most common first
_TABLE: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("T4", 15360, ("t4", "teslat4")),
    ("L4", 23034, ("l4",)),
    ("A10", 23028, ("a10", "a10g")),
    ("V100 16 GB", 16384, ("v100", "v100-16gb", "v10016gb")),
    ("V100 32 GB", 32768, ("v100-32gb", "v10032gb")),
    ("RTX 3090", 24576, ("rtx3090", "3090")),
    ("RTX 4090", 24564, ("rtx4090", "4090")),
    ("A100 40 GB", 40960, ("a100", "a100-40gb", "a10040gb")),
    ("A100 80 GB", 81920, ("a100-80gb", "a10080gb")),
    ("L40S", 46068, ("l40s",)),
    ("H100 80 GB", 81559, ("h100", "h100-80gb", "h10080gb")),
    ("H200", 143771, ("h200",)),
)
COMMON = ("T4", "L4", "A100 80 GB")  # shown when no GPU is named: 16, 24 and 80 GB
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g)?\s*$", re.IGNORECASE)


def _usable(total: int) -> int:
    return max(0, total - CONTEXT_BYTES)


def known_names() -> list[str]:
    return [name for name, _, _ in _TABLE]


def gpu_named(spec: str | float) -> Gpu:
    """The GPU a user names: a table entry (``"T4"``, ``"a100-80gb"``) or a size in GiB. Raises
    ``ValueError`` with the names known."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        size = float(spec)
    else:
        text = str(spec).strip()
        key = text.lower().replace(" ", "").replace("nvidia", "").replace("tesla", "")
        for name, mib, aliases in _TABLE:
            if key in aliases or key == name.lower().replace(" ", ""):
                total = mib * MiB
                source = "measured here" if name == "H200" else "nvidia-smi total"
                return Gpu(name, total, _usable(total), source)
        match = _SIZE.match(text)
        if not match:
            raise ValueError(f"unknown GPU {text!r}: name one of {', '.join(known_names())}, or give its memory "
                             "in GiB (e.g. 24)")
        size = float(match.group(1))
    if not 0 < size <= 4096:
        raise ValueError(f"a GPU's memory must be between 0 and 4096 GiB, not {size:g}")
    total = int(size * GiB)
    return Gpu(f"{size:g} GiB GPU", total, _usable(total), "the size given")


def with_cap(name: str, cap_bytes: int) -> Gpu:
    """A budget for torch's allocator itself (``set_per_process_memory_fraction``): no context taken off."""
    return Gpu(name, cap_bytes, cap_bytes, "a cap on torch's allocator")
