"""Between micro-batches the workers hand the caching allocator's free blocks back to the device once they
pass a limit (workers/fsdp/micro_batching.py), so the device's use follows the micro-batch's peak."""

import pytest
import torch

from workers.fsdp.micro_batching import release_cached_blocks


def test_nothing_to_release_on_the_cpu():
    assert release_cached_blocks(torch.device("cpu"), limit=0) is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator is CUDA's")
def test_free_blocks_above_the_limit_go_back_to_the_device():
    device = torch.device("cuda")
    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    del block
    assert release_cached_blocks(device, limit=128 << 20) is False  # under the limit: kept for reuse
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) >= 64 << 20
    assert release_cached_blocks(device, limit=1 << 20) is True
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) < 1 << 20
