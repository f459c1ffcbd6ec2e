"""The simulated caching allocator keeps the books torch's CUDA caching allocator keeps
(default settings: c10/cuda/CUDACachingAllocator.cpp), so CPU tests see its layout effects."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.memory.oom_message import find_oom, parse_oom_message  # noqa: E402
from gpunb.testing import CachingMemory  # noqa: E402
from gpunb.testing.fake_caching_allocator import CachingAllocator  # noqa: E402

MiB = 2**20
GiB = 2**30


def test_requests_are_rounded_and_served_from_pools_of_torch_sizes():
    a = CachingAllocator(GiB)
    tiny = a.malloc(100)
    assert tiny.size == 512 and a.stats.reserved == 2 * MiB  # the small pool's 2 MiB segment
    mid = a.malloc(5 * MiB)
    assert mid.size == 5 * MiB and a.stats.reserved == 22 * MiB  # a 20 MiB segment, split
    big = a.malloc(30 * MiB + 1)
    assert big.size == 30 * MiB + 512 and a.stats.reserved == 22 * MiB + 32 * MiB  # rounded to 2 MiB
    assert a.stats.allocated == 512 + 5 * MiB + 30 * MiB + 512


def test_best_fit_splits_and_a_freed_block_merges_with_its_free_neighbours():
    a = CachingAllocator(GiB)
    blocks = [a.malloc(s) for s in (64 * MiB, 16 * MiB)]
    for b in blocks:
        a.free(b)
    x = a.malloc(12 * MiB)
    assert x.segment == blocks[1].segment  # the smallest cached block that fits
    y = a.malloc(3 * MiB)  # the 4 MiB left there; the 1 MiB rest is too small to split off (large pool)
    assert y.segment == blocks[1].segment and y.size == 4 * MiB
    a.free(x)
    a.free(y)
    assert a.inactive_split_bytes() == 0 and a.release_cached() == 2 and a.stats.reserved == 0


def test_a_segment_holding_one_live_block_cannot_be_given_back():
    a = CachingAllocator(GiB)
    act = a.malloc(512 * MiB)
    a.free(act)
    state = a.malloc(64 * MiB)  # carved out of the freed activation's segment
    assert state.segment == act.segment and a.inactive_split_bytes() == 448 * MiB
    assert a.release_cached() == 0 and a.stats.reserved == 512 * MiB


def test_over_the_cap_the_cache_is_given_back_once_then_it_is_an_out_of_memory_error():
    a = CachingAllocator(GiB, torch=torch)
    a.free(a.malloc(600 * MiB))
    b = a.malloc(700 * MiB)  # 600 + 700 > 1024: the free segment is given back, then it fits
    assert a.stats.num_alloc_retries == 1 and a.stats.segments_freed == 1 and a.stats.reserved == 700 * MiB
    with pytest.raises(torch.OutOfMemoryError) as err:
        a.malloc(400 * MiB)
    assert a.stats.num_ooms == 1 and a.stats.num_alloc_retries == 2
    assert find_oom(err.value) is not None
    parsed = parse_oom_message(str(err.value))
    assert parsed.requested_bytes == 400 * MiB
    a.free(b)


def test_a_tensor_tied_to_a_block_frees_it_when_it_is_garbage():
    mem = CachingMemory(GiB)
    t = torch.zeros(3)
    mem.tie(t, mem.alloc(10 * MiB))
    assert mem.tied(t) and mem.allocated() == 10 * MiB
    del t
    gc.collect()
    assert mem.allocated() == 0
    mem.reset_peaks()
    assert mem.peaks() == (0, mem.reserved())
    mem.settle()
    assert mem.reserved() == 0 and mem.pressure() == (0, 0)
