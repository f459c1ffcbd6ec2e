"""What torch's CUDA caching allocator makes of a sequence of allocations and frees: the bytes it
counts as allocated and reserved, at each event.

The facts are those of ``c10/cuda/CUDACachingAllocator.cpp`` with torch's default settings (no
``expandable_segments``, no ``max_split_size_mb``), also modelled by the test fake
``gpunb/testing/fake_caching_allocator.py`` (which raises out-of-memory errors; this one only
keeps books, and lives in the product):

- a request is rounded up to 512 B; up to 1 MiB it comes from the small pool (2 MiB segments),
  above from the large pool: a 20 MiB segment for requests under 10 MiB, else the request
  rounded up to 2 MiB;
- the smallest cached free block that fits is taken (ties: the lowest address) and split when
  what is left is worth keeping (small pool: 512 B or more; large pool: more than 1 MiB), so an
  unsplit large block counts whole as allocated;
- a freed block merges with its free neighbours; segments are kept (reserved) until
  ``empty_cache()``;
- under a cap (``set_per_process_memory_fraction``, or the GPU's memory), a segment that would
  pass it first makes the allocator give back every cached segment that is entirely free and try
  again; only then is it an out-of-memory error (:class:`OutOfMemory` here).

``max_memory_allocated`` is the peak of the allocated count, ``max_memory_reserved`` the peak of
the segments.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MiB = 2**20
MIN_BLOCK = 512
SMALL_REQUEST = 1 * MiB
SMALL_SEGMENT = 2 * MiB
MEDIUM_SEGMENT = 20 * MiB
LARGE_REQUEST = 10 * MiB
LARGE_ROUNDING = 2 * MiB


def round_size(nbytes: int) -> int:
    """The block size torch gives a request of ``nbytes`` (0 bytes: no block)."""
    if nbytes <= 0:
        return 0
    return -(-int(nbytes) // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment torch reserves when no cached block fits a block of ``size``."""
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < LARGE_REQUEST:
        return MEDIUM_SEGMENT
    return -(-size // LARGE_ROUNDING) * LARGE_ROUNDING


@dataclass(eq=False)
class Block:
    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


class OutOfMemory(Exception):
    """The request that would not fit under the cap, in bytes (``args[0]``)."""


class AllocatorModel:
    """The block books of one device and stream. ``malloc`` returns a handle for ``free``."""

    def __init__(self, cap_bytes: int | None = None) -> None:
        self.cap = cap_bytes
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._free: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}
        self._next_address = 0

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block), key=lambda e: (e[0], e[1]))

    def _remove(self, block: Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.size, block.address), key=lambda e: (e[0], e[1]))
        del pool[i]

    def malloc(self, nbytes: int) -> Block | None:
        size = round_size(nbytes)
        if size == 0:
            return None
        small = size <= SMALL_REQUEST
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1), key=lambda e: (e[0], e[1]))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            seg = segment_size(size)
            if self.cap is not None and self.reserved + seg > self.cap:
                self.release_cached()
                if self.reserved + seg > self.cap:
                    raise OutOfMemory(size)
            block = Block(self._next_address, seg, small)
            self._next_address += seg
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_REQUEST):
            tail = Block(block.address + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block | None) -> None:
        if block is None or not block.allocated:
            return
        block.allocated = False
        self.allocated -= block.size
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

    def release_cached(self) -> None:
        """Give back every cached segment that is one free block (torch's ``release_cached_blocks``)."""
        for small in (True, False):
            keep = []
            for entry in self._free[small]:
                if entry[2].prev is None and entry[2].next is None:
                    self.reserved -= entry[2].size
                else:
                    keep.append(entry)
            self._free[small] = keep

    def reset_peaks(self) -> None:
        """As ``torch.cuda.reset_peak_memory_stats``: the peaks start again from now."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
