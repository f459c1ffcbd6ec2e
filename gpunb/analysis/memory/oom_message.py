"""Recognise CUDA out-of-memory errors and read the numbers in their messages.

Recognition walks ``__cause__``/``__context__`` (libraries wrap the error) and accepts:
torch's ``OutOfMemoryError`` (checked by type when torch is imported), RuntimeErrors
saying "CUDA out of memory", and cuDNN/cuBLAS allocation failures.

The message of torch >= 2.2 (the real one recorded on the H200 is in the test trace)::

    CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity of
    139.80 GiB of which 12.88 GiB is free. [Process 123 has 40.00 GiB memory in use.]
    Including non-PyTorch memory, this process has 126.92 GiB memory in use. Of the
    allocated memory 126.19 GiB is allocated by PyTorch, and 2.23 MiB is reserved by
    PyTorch but unallocated. ...

and the older one (torch 1.x)::

    CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity;
    130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_UNITS = {"bytes": 1, "byte": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
# Every pattern here is linear in the message: numbers are bounded runs that must start
# at a run's first digit, gaps are bounded, and sizes written before their label are
# looked for in a short window behind the label, not by a search from every digit (a
# megabyte message of digits took minutes with `[0-9]+` patterns). A number of more than
# 15 digits is not a size.
_NUM = r"(\d{1,15}(?:\.\d{1,6})?)(?!\d|\.\d)"
_UNIT = r"(bytes|byte|KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)\b"
_GAP = r"\s{1,4}"
_SIZE = _NUM + r"\s{0,4}" + _UNIT
_SIZE_BEFORE = re.compile(r"(?<![\d.])" + _SIZE + r"\s{0,4}$", re.I)  # ends right at the label
_WINDOW = 48  # characters behind a label that may hold its size

# What kind of allocation failure, by message text (checked in this order).
_KINDS = (
    ("cuda", re.compile(r"CUDA out of memory", re.I)),
    ("cudnn", re.compile(r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_SUPPORTED)")),
    ("cublas", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    ("cuda", re.compile(r"cudaErrorMemoryAllocation|CUDA error: out of memory", re.I)),
)
_OUT_OF_MEMORY = re.compile(r"out of memory", re.I)
_CUDA_WORD = re.compile(r"\bcuda", re.I)


def _kind(text: str) -> str | None:
    kind = next((k for k, rx in _KINDS if rx.search(text)), None)
    if kind is not None:
        return kind
    # "out of memory" with "cuda" later on the same line: one look per line, never a
    # search from every occurrence to the end of its line.
    for line in text.splitlines():
        m = _OUT_OF_MEMORY.search(line)
        if m and _CUDA_WORD.search(line, m.end()):
            return "cuda"
    return None


def size_to_bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit.lower()])


@dataclass(frozen=True)
class OomMessage:
    """Numbers from an OOM message (``None`` where the message does not say)."""

    kind: str  # "cuda" | "cudnn" | "cublas"
    text: str
    device: int | None = None
    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    process_bytes: int | None = None  # this process, including non-PyTorch memory
    allocated_bytes: int | None = None  # by PyTorch
    reserved_unallocated_bytes: int | None = None
    reserved_bytes: int | None = None  # old message: "reserved in total"
    allowed_bytes: int | None = None  # set_per_process_memory_fraction cap
    other_processes: tuple[tuple[int, int], ...] = field(default_factory=tuple)  # (pid, bytes)

    @property
    def non_torch_bytes(self) -> int | None:
        """Context, cuDNN/cuBLAS/NCCL workspaces and other libraries of this process."""
        if self.process_bytes is None:
            return None
        reserved = self.reserved_bytes
        if reserved is None and self.allocated_bytes is not None and self.reserved_unallocated_bytes is not None:
            reserved = self.allocated_bytes + self.reserved_unallocated_bytes
        if reserved is None:
            return None
        return max(0, self.process_bytes - reserved)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in (
            "kind", "device", "requested_bytes", "total_bytes", "free_bytes", "process_bytes",
            "allocated_bytes", "reserved_unallocated_bytes", "reserved_bytes", "allowed_bytes")}
        d["other_processes"] = [list(p) for p in self.other_processes]
        d["non_torch_bytes"] = self.non_torch_bytes
        return d


def _after(label: str, text: str, tail: str = "") -> int | None:
    """The size written right after ``label`` (and before ``tail``)."""
    m = re.search(label + _GAP + _SIZE + tail, text, re.I)
    return size_to_bytes(m.group(1), m.group(2)) if m else None


def _before(label: str, text: str, lowered: str, word: str) -> int | None:
    """The size written right before ``label``: looked for behind each label found.

    ``word`` is a plain part of the label; when the lowered text lacks it the label is not
    searched at all (a case-blind regex scan of a megabyte takes ~50 ms; ``in`` takes 1 ms)."""
    if word not in lowered:
        return None
    for m in re.finditer(label, text, re.I):
        size = _SIZE_BEFORE.search(text, max(0, m.start() - _WINDOW), m.start())
        if size:
            return size_to_bytes(size.group(1), size.group(2))
    return None


def parse_oom_message(text: str) -> OomMessage | None:
    """Read an OOM message; ``None`` when the text is not an allocation failure. Linear
    in the length of the message."""
    kind = _kind(text)
    if kind is None:
        return None
    low = text.lower()
    m = re.search(r"GPU" + _GAP + r"(\d{1,4})(?!\d)", text)
    device = int(m.group(1)) if m else None
    requested = _after(r"Tried to allocate", text)
    total = _after(r"total capacity of", text) or _before(r"\btotal capacity", text, low, "capacity")
    free = _after(r"of which", text, _GAP + r"is free") or _before(r"\bfree\b", text, low, "free")
    process = _after(r"this process has", text, _GAP + r"memory in use")
    allocated = (_before(r"\bis allocated by PyTorch", text, low, "allocated by")
                 or _before(r"\balready allocated", text, low, "already"))
    unalloc = _before(r"\bis reserved by PyTorch but unallocated", text, low, "unallocated")
    reserved = _before(r"\breserved in total by PyTorch", text, low, "in total")
    allowed = _before(r"\b(?:is\s{1,4})?allowed", text, low, "allowed")
    others = tuple(
        (int(pid), size_to_bytes(num, unit))
        for pid, num, unit in re.findall(
            r"Process" + _GAP + r"(\d{1,10})(?!\d)" + _GAP + "has" + _GAP + _SIZE + _GAP + "memory in use", text)
    )
    return OomMessage(kind, text, device, requested, total, free, process, allocated, unalloc, reserved, allowed,
                      others)


def _oom_types() -> tuple[type, ...]:
    torch = sys.modules.get("torch")
    types: list[type] = []
    for owner, name in ((torch, "OutOfMemoryError"), (getattr(torch, "cuda", None), "OutOfMemoryError")):
        t = getattr(owner, name, None) if owner is not None else None
        if isinstance(t, type) and t not in types:
            types.append(t)
    return tuple(types)


def exception_chain(exc: BaseException, limit: int = 32) -> Iterator[BaseException]:
    """``exc``, then its causes/contexts, each once (cycles happen)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < limit:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__])


def find_oom(exc: BaseException | None, extra_types: tuple[type, ...] = ()) -> BaseException | None:
    """The CUDA allocation failure inside ``exc`` (itself or a cause/context), or ``None``.

    ``extra_types`` are treated as OOMs too (tests, or a library's own OOM class).
    """
    if exc is None:
        return None
    types = _oom_types() + tuple(extra_types)
    for e in exception_chain(exc):
        if types and isinstance(e, types):
            return e
        if isinstance(e, (RuntimeError, MemoryError)) or type(e).__name__ in ("OutOfMemoryError", "AcceleratorError"):
            try:
                msg = str(e)
            except BaseException:  # noqa: BLE001 (its __str__ raised: no OOM we can read)
                continue
            if "DefaultCPUAllocator" in msg:
                continue  # host RAM, not the GPU
            if _kind(msg) is not None:
                return e
    return None


def is_oom(exc: BaseException | None) -> bool:
    return find_oom(exc) is not None
