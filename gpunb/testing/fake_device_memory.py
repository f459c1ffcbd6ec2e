"""A pretend GPU memory with a byte budget, for CPU tests of ``%gpufit`` and its benchmark.

The training steps of the tests (and of ``benchmarks/batch_fit_zoo.py --smoke``) run real
torch code on the CPU and *charge* this object the bytes their GPU twin would use. Above the
budget it raises ``torch.OutOfMemoryError`` with the text of a real CUDA message, so every
caller (``%gpufit``, Lightning's ``BatchSizeFinder``, accelerate's
``find_executable_batch_size``) sees what it would see on a GPU. It models the two allocator
behaviours the search reads: peak reserved above peak allocated (``fragmentation``), and the
cache given back under pressure when reserved would exceed the budget.

It implements :class:`gpunb.analysis.fit.trial.DeviceMemory`. The numbers are the test's
own; real ones come from the GPU tests.
"""

from __future__ import annotations

import math
from typing import Any

GiB = 2**30
SEGMENT = 2 * 2**20


class BudgetMemory:
    def __init__(self, budget_bytes: int, *, fragmentation: float = 0.0, torch: Any = None) -> None:
        if torch is None:
            import torch
        self.torch = torch
        self.device = torch.device("cpu")
        self.budget = int(budget_bytes)
        self.fragmentation = fragmentation
        self.kept = 0  # bytes that stay between steps (weights, optimizer state)
        self.reserved_now = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments_released = 0
        self.ooms = 0

    # -- what a simulated step calls ---------------------------------------------------------------

    def keep(self, nbytes: int) -> None:
        """Bytes that stay allocated (a model's weights, an optimizer's state)."""
        self._check(nbytes)
        self.kept += int(nbytes)
        self._account(0)

    def use(self, nbytes: int) -> None:
        """A step's transient peak of ``nbytes`` on top of what is kept (activations, temporaries)."""
        self._check(nbytes)
        self._account(int(nbytes))

    def _check(self, nbytes: int) -> None:
        if self.kept + nbytes > self.budget:
            self.ooms += 1
            free = max(0, self.budget - self.kept)
            raise self.torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {(nbytes - free) / GiB:.2f} GiB. GPU 0 has a total capacity "
                f"of {self.budget / GiB:.2f} GiB of which {free / GiB:.2f} GiB is free. Including non-PyTorch "
                f"memory, this process has {self.kept / GiB:.2f} GiB memory in use. Of the allocated memory "
                f"{self.kept / GiB:.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
                "unallocated. (simulated by gpunb.testing.BudgetMemory)")

    def _account(self, transient: int) -> None:
        allocated = self.kept + transient
        wanted = self.kept + math.ceil(transient * (1 + self.fragmentation) / SEGMENT) * SEGMENT
        if wanted > self.budget:  # the allocator frees its cache and retries: it fits, at the edge
            self.segments_released += 1
            wanted = self.budget
        self.reserved_now = max(self.reserved_now, wanted)
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved_now)

    # -- DeviceMemory ----------------------------------------------------------------------------

    def settle(self) -> None:
        # (no gc.collect(): the pretend bytes are freed by accounting, and a collection costs
        # ~0.3 s in a process holding torch, twice a trial)
        if self.reserved_now > self.kept:
            self.segments_released += 1  # as torch.cuda.empty_cache() counts its cudaFree calls
        self.reserved_now = self.kept

    def synchronize(self) -> None:
        pass

    def allocated(self) -> int:
        return self.kept

    def peaks(self) -> tuple[int, int]:
        return self.peak_allocated, self.peak_reserved

    def reset_peaks(self) -> None:
        self.peak_allocated = self.kept
        self.peak_reserved = self.reserved_now

    def pressure(self) -> tuple[int, int]:
        return self.segments_released, self.ooms
