"""A vLLM engine's sleep that frees only its KV cache (GPU sleep mode), for an engine whose weights the
trainer's tensors point into (workers/fsdp/shared_base.py).

With sleep mode vLLM allocates through its `CuMemAllocator`: every allocation made while loading the model
is tagged "weights" (parameters, and a LoRA engine's adapter slots), the KV cache "kv_cache"; each is a
virtual address range with physical memory mapped to it. vLLM's own `sleep(level)` unmaps all of them
(level 1 first copies the weights to host memory): the trainer's views of the weights would then point at
unmapped memory. Here only the "kv_cache" ranges are unmapped (their physical memory goes back to the
device; the addresses stay reserved), and waking maps fresh memory at the same addresses through the
worker's own `wake_up(tags=["kv_cache"])`, which also re-initialises what depends on the cache. The cache's
contents are forgotten, as with any sleep: the caller resets the prefix cache first. These are vLLM
internals (vllm/device_allocator/cumem.py, the worker's `wake_up`), alike in vLLM 0.26 and 0.32.
"""

from __future__ import annotations

import torch

KV_CACHE_TAG = "kv_cache"  # vLLM's tag of the KV cache allocations (gpu_worker's memory pool context)


def release_kv_cache() -> int:
    """Unmap the KV cache's memory (the weights stay mapped); returns the bytes given back to the device."""
    from vllm.device_allocator.cumem import CuMemAllocator, unmap_and_release

    torch.cuda.synchronize()  # no kernel may still read the cache
    released = 0
    for data in CuMemAllocator.get_instance().pointer_to_data.values():  # vLLM's `AllocationData` records
        if data.tag == KV_CACHE_TAG and not data.is_asleep:
            unmap_and_release(data.handle)
            data.is_asleep = True
            released += int(data.handle[1])
    return released
