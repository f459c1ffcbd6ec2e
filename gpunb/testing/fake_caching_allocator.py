"""A pretend GPU memory that keeps books the way torch's CUDA caching allocator does.

:class:`~gpunb.testing.fake_device_memory.BudgetMemory` only knows a byte budget. What decides
whether a batch *trains* near the limit is the layout of the allocator's blocks, so this
one models it, with torch's default settings (``c10/cuda/CUDACachingAllocator.cpp``;
no ``expandable_segments``, no ``max_split_size_mb``):

- sizes are rounded up to 512 B; requests up to 1 MiB come from a small pool of 2 MiB
  segments, larger ones from a large pool: a 20 MiB segment for requests under 10 MiB,
  else a segment of the request rounded up to 2 MiB;
- a request takes the smallest free cached block that fits (ties: the lowest address) and
  splits it when what is left is worth keeping (small pool: 512 B or more; large pool: more
  than 1 MiB); a freed block merges with free neighbours of its segment;
- a new segment is made only when no cached block fits, and only while the reserved bytes
  stay within the cap (``set_per_process_memory_fraction``); when they would not, every cached
  segment that is entirely free is given back and the allocation is tried once more (torch
  counts this in ``num_alloc_retries``); only then is it an out-of-memory error
  (``num_ooms``), raised as ``torch.OutOfMemoryError`` with the text of a real one.

So a segment that holds one small live tensor cannot be given back, and what is free in it
can only serve requests that fit there: the fragmentation that makes a fresh process fail
where the fitting process did not. The numbers of a test are the test's own; real ones come
from the GPU tests.

Tensors of a CPU stand-in model are tied to simulated blocks (:meth:`CachingMemory.tie`):
the block is freed when the tensor is garbage, as a CUDA tensor's memory would be.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass, field
from typing import Any

GiB = 2**30
MiB = 2**20
MIN_BLOCK = 512
SMALL_REQUEST = 1 * MiB  # up to this: the small pool
SMALL_SEGMENT = 2 * MiB
MEDIUM_SEGMENT = 20 * MiB  # for requests between 1 and 10 MiB
LARGE_REQUEST = 10 * MiB
LARGE_ROUNDING = 2 * MiB


@dataclass(eq=False)
class Block:
    segment: int
    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None
    requested: int = 0

    @property
    def split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass
class AllocatorStats:
    allocated: int = 0  # bytes in allocated blocks (rounded sizes, as torch counts them)
    reserved: int = 0  # bytes in segments
    peak_allocated: int = 0
    peak_reserved: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    segments_freed: int = 0
    segments_made: int = 0
    extra: dict = field(default_factory=dict)


def round_size(nbytes: int) -> int:
    return max(MIN_BLOCK, -(-int(nbytes) // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < LARGE_REQUEST:
        return MEDIUM_SEGMENT
    return -(-size // LARGE_ROUNDING) * LARGE_ROUNDING


class CachingAllocator:
    """The block bookkeeping of one device (one stream)."""

    def __init__(self, cap_bytes: int, *, torch: Any = None, device_total: int | None = None) -> None:
        self.cap = int(cap_bytes)
        self.device_total = device_total or self.cap
        self.torch = torch
        self.stats = AllocatorStats()
        self._free: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}  # small?: sorted (size, addr)
        self._next_address = 1 << 40
        self._segments = 0

    # -- the pools --------------------------------------------------------------------------------

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block), key=lambda e: (e[0], e[1]))

    def _remove(self, block: Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.size, block.address), key=lambda e: (e[0], e[1]))
        assert pool[i][2] is block
        del pool[i]

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1), key=lambda e: (e[0], e[1]))
        if i == len(pool):
            return None
        block = pool[i][2]
        del pool[i]
        return block

    def _new_segment(self, size: int, small: bool, retry: bool) -> Block | None:
        if retry:
            self.stats.num_alloc_retries += 1
        if self.stats.reserved + size > self.cap:
            return None
        self._segments += 1
        block = Block(self._segments, self._next_address, size, small)
        self._next_address += size + 2 * MiB
        self.stats.reserved += size
        self.stats.segments_made += 1
        self.stats.peak_reserved = max(self.stats.peak_reserved, self.stats.reserved)
        return block

    def release_cached(self) -> int:
        """Give back every segment that is one free block (torch: ``release_cached_blocks``);
        the number of segments given back."""
        released = 0
        for small in (True, False):
            keep = []
            for entry in self._free[small]:
                block = entry[2]
                if block.split:
                    keep.append(entry)
                else:
                    self.stats.reserved -= block.size
                    released += 1
            self._free[small] = keep
        self.stats.segments_freed += released
        return released

    # -- malloc / free ----------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_REQUEST
        block = self._best_fit(size, small)
        if block is None:
            alloc = segment_size(size)
            block = self._new_segment(alloc, small, retry=False)
            if block is None:
                self.release_cached()
                block = self._new_segment(alloc, small, retry=True)
            if block is None:
                self.stats.num_ooms += 1
                raise self._oom(size)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_REQUEST):
            tail = Block(block.segment, block.address + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.allocated = True
        block.requested = int(nbytes)
        self.stats.allocated += block.size
        self.stats.peak_allocated = max(self.stats.peak_allocated, self.stats.allocated)
        return block

    def free(self, block: Block) -> None:
        if not block.allocated:
            return
        block.allocated = False
        self.stats.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove(neighbour)
                if neighbour is block.prev:
                    block.address, block.prev = neighbour.address, neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
        self._insert(block)

    def inactive_split_bytes(self) -> int:
        """Free bytes inside segments that also hold live blocks: cached, but not returnable."""
        return sum(e[0] for small in (True, False) for e in self._free[small] if e[2].split)

    def _oom(self, size: int) -> BaseException:
        torch = self.torch
        if torch is None:
            import torch
        s = self.stats
        free = max(0, self.cap - s.reserved)
        return torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {_gib(size)}. GPU 0 has a total capacity of "
            f"{_gib(self.device_total)} of which {_gib(free)} is free. Including non-PyTorch memory, this process "
            f"has {_gib(s.reserved)} memory in use. Of the allocated memory {_gib(s.allocated)} is allocated by "
            f"PyTorch, and {_gib(s.reserved - s.allocated)} is reserved by PyTorch but unallocated. "
            "(simulated by gpunb.testing.CachingMemory)")


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB"


class CachingMemory:
    """:class:`gpunb.analysis.fit.trial.DeviceMemory` over a :class:`CachingAllocator`, for
    training steps that run on the CPU and charge it the blocks their GPU twin would take."""

    def __init__(self, cap_bytes: int, *, torch: Any = None) -> None:
        if torch is None:
            import torch
        self.torch = torch
        self.device = torch.device("cpu")
        self.budget = int(cap_bytes)
        self.allocator = CachingAllocator(cap_bytes, torch=torch)
        self._ties: dict[int, list[Block]] = {}  # id(tensor) -> its blocks (tensors compare by value: no dict keys)

    # -- what a simulated step calls ---------------------------------------------------------------

    def alloc(self, nbytes: int) -> Block:
        return self.allocator.malloc(nbytes)

    def free(self, block: Block | None) -> None:
        if block is not None:
            self.allocator.free(block)

    def tie(self, tensor: Any, *blocks: Block) -> None:
        """Free ``blocks`` when ``tensor`` is garbage (its device memory, for a CPU stand-in)."""
        key = id(tensor)
        if key in self._ties:
            self._ties[key].extend(blocks)
        else:
            self._ties[key] = list(blocks)
            weakref.finalize(tensor, self._release, key)

    def tied(self, tensor: Any) -> bool:
        return tensor is not None and id(tensor) in self._ties

    def _release(self, key: int) -> None:
        for b in self._ties.pop(key, ()):
            self.allocator.free(b)

    # -- DeviceMemory ------------------------------------------------------------------------------

    def settle(self) -> None:
        # (no gc.collect(): tied tensors die by reference counting, and a collection costs
        # ~0.3 s in a process holding torch, twice a trial)
        self.allocator.release_cached()

    def synchronize(self) -> None:
        pass

    def allocated(self) -> int:
        return self.allocator.stats.allocated

    def reserved(self) -> int:
        return self.allocator.stats.reserved

    def peaks(self) -> tuple[int, int]:
        return self.allocator.stats.peak_allocated, self.allocator.stats.peak_reserved

    def reset_peaks(self) -> None:
        s = self.allocator.stats
        s.peak_allocated, s.peak_reserved = s.allocated, s.reserved

    def pressure(self) -> tuple[int, int]:
        s = self.allocator.stats
        return s.num_alloc_retries, s.num_ooms
