"""The plan's caching-allocator books (gpunb/analysis/plan/allocator.py), checked on generated
sequences of allocations and frees against the test fake written from the same C++ source
(gpunb/testing/fake_caching_allocator.py): the same allocated and reserved bytes, the same peaks,
the same request failing under a cap. The class: what the allocator makes of any sequence."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpunb.analysis.plan.allocator import (  # noqa: E402
    MIN_BLOCK,
    AllocatorModel,
    OutOfMemory,
    round_size,
    segment_size,
)
from gpunb.testing.fake_caching_allocator import CachingAllocator  # noqa: E402

MiB = 2**20
# sizes around every threshold of the allocator: 512 B, 1 MiB (small pool), 10 MiB (20 MiB segments)
SIZES = st.one_of(st.integers(1, 4096), st.integers(MiB - 2048, MiB + 2048), st.integers(1, 12 * MiB),
                  st.integers(10 * MiB - 1024, 10 * MiB + 1024), st.integers(12 * MiB, 200 * MiB))
# an op: allocate a size, or free the live block at a position (modulo how many are live)
OPS = st.lists(st.one_of(st.tuples(st.just("a"), SIZES), st.tuples(st.just("f"), st.integers(0, 1000))),
               min_size=1, max_size=80)


@given(st.integers(1, 10**10))
def test_a_request_is_rounded_up_to_512_bytes(n):
    size = round_size(n)
    assert size % MIN_BLOCK == 0 and n <= size < n + MIN_BLOCK


def test_segments_follow_the_pools():
    assert segment_size(512) == 2 * MiB and segment_size(MiB) == 2 * MiB  # small pool
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(10 * MiB + 512) == 12 * MiB  # rounded to 2 MiB
    assert round_size(0) == 0


def _run(ops, cap):
    model, fake = AllocatorModel(cap), CachingAllocator(cap, torch=torch)
    live: list[tuple[object, object]] = []
    for kind, value in ops:
        if kind == "a":
            try:
                mine = model.malloc(value)
            except OutOfMemory:
                with pytest.raises(torch.OutOfMemoryError):
                    fake.malloc(value)
                return model, fake
            live.append((mine, fake.malloc(value)))
        elif live:
            mine, theirs = live.pop(value % len(live))
            model.free(mine)
            fake.free(theirs)
        s = fake.stats
        assert (model.allocated, model.reserved) == (s.allocated, s.reserved)
        assert (model.peak_allocated, model.peak_reserved) == (s.peak_allocated, s.peak_reserved)
    return model, fake


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_books_match_the_fake_allocator(ops):
    _run(ops, cap=1 << 50)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(4 * MiB, 400 * MiB))
def test_under_a_cap_the_same_request_fails(ops, cap):
    """Cached free segments are given back before a request fails, as torch does."""
    _run(ops, cap)


def test_an_unsplit_large_block_counts_whole():
    """A large block with 1 MiB or less left over is not split: torch counts all of it as allocated."""
    model = AllocatorModel()
    first = model.malloc(20 * MiB)
    model.free(first)
    model.malloc(19 * MiB + 512)  # 1 MiB - 512 B left: not worth a block
    assert model.allocated == 20 * MiB
