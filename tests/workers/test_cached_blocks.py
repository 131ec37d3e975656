"""Between micro-batches the workers hand the caching allocator's free blocks back to the device when it
reserves more than a limit beyond its peak (workers/training/micro_batching.py), so the device's use follows the
micro-batches' peak."""

import pytest
import torch

from workers.cached_blocks import release_cached_blocks


def test_nothing_to_release_on_the_cpu():
    assert release_cached_blocks(torch.device("cpu"), limit=0) is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator is CUDA's")
def test_a_reserve_beyond_the_peak_goes_back_to_the_device():
    device = torch.device("cuda")
    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    del block
    # The reserve equals what was allocated at the peak: kept for the next micro-batch to reuse.
    assert release_cached_blocks(device, limit=1 << 20) is False
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) >= 64 << 20
    torch.cuda.reset_peak_memory_stats(device)  # now the reserve is beyond anything allocated at once
    assert release_cached_blocks(device, limit=128 << 20) is False  # under the limit
    assert release_cached_blocks(device, limit=1 << 20) is True
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) < 1 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator is CUDA's")
def test_emptying_the_cache_shows_in_the_device_allocation_count():
    from workers.memory import allocator_counts, memory_reading

    device = torch.device("cuda")
    before = allocator_counts(device)["device_allocs_total"]
    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    del block
    torch.cuda.empty_cache()
    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)  # the cache was emptied: a new device allocation
    assert allocator_counts(device)["device_allocs_total"] >= before + 2
    assert {"device_allocs_total", "alloc_retries_total"} <= set(memory_reading(device))
