"""Many small device tensors to host memory in a few large copies, their |w| summed on the way.

A mixture of experts' LoRA adapter in vLLM is tens of thousands of small factors (48 layers x 128 experts x 3
projections x A and B at 30B-A3B). Copied one by one, each is a synchronous device->host copy and each sum a
handful of kernels; packed into chunks, each chunk is one copy and one sum, and the host tensors are views of it.
From a CUDA device a chunk lands in page-locked memory from PyTorch's caching host allocator (which
`pin_memory=True` allocates from): one DMA at the link's speed. A pageable 128 MiB chunk is fresh memory at every
sync (glibc maps so large a block anew: page faults on all of it), copied through the driver's staging buffer:
the likely cause of rollout/sync_s 2.2-2.6 s at 30B-A3B r16, against 0.64-0.83 s one factor at a time
(benchmarks/lora_host_copy.py compares the three). The previous adapter's host copy is freed before the next is made
(vllm_adapter.register_adapter), its pinned chunks go back to that allocator and the next sync reuses them: only
the first sync page-locks, and the process keeps about one adapter's size of pinned host memory. From the host
(vLLM's CPU build) a chunk stays plain memory: pinning needs an accelerator.
Not the weight sync's buckets (workers/rollout/buckets.py): those pack tensors of mixed dtypes into byte buffers
one copy per tensor, with alignment gaps that a |w| sum of the buffer would read; a chunk here is one dtype, packed
by one `torch.cat`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workers.rollout.verify import WeightFingerprint

CHUNK_BYTES = 128 * 2**20  # the packed chunk's extra device memory while it is copied


def host_copies(
    tensors: Sequence[torch.Tensor], fingerprint: WeightFingerprint, chunk_bytes: int = CHUNK_BYTES
) -> list[torch.Tensor]:
    """Host copies of `tensors` (same shapes, dtypes and values, in order: views of packed chunks, page-locked
    where `pinned_host` says so), each chunk's |w| added to `fingerprint` while still on its device."""
    copies = list(tensors)  # each replaced by its copy below
    chunk: list[int] = []
    chunk_size = 0
    for index, tensor in enumerate(tensors):
        if chunk and (chunk_size + tensor.nbytes > chunk_bytes or _key(tensors[chunk[0]]) != _key(tensor)):
            _copy_chunk(tensors, chunk, copies, fingerprint)
            chunk, chunk_size = [], 0
        chunk.append(index)
        chunk_size += tensor.nbytes
    if chunk:
        _copy_chunk(tensors, chunk, copies, fingerprint)
    return copies


def pinned_host(device: torch.device) -> bool:
    """Whether a copy from `device` goes to page-locked host memory: from a CUDA device only (from the host,
    pinning would need an accelerator and buys nothing)."""
    return device.type == "cuda"


def _key(tensor: torch.Tensor) -> tuple[torch.device, torch.dtype]:
    return tensor.device, tensor.dtype  # one chunk holds one dtype from one device


def _copy_chunk(
    tensors: Sequence[torch.Tensor], chunk: list[int], copies: list[torch.Tensor], fingerprint: WeightFingerprint
) -> None:
    packed = torch.cat([tensors[index].detach().reshape(-1) for index in chunk])
    fingerprint.add([packed])  # queued on the device before `packed` can be freed
    if pinned_host(packed.device):
        on_host = torch.empty(packed.shape, dtype=packed.dtype, device="cpu", pin_memory=True)
        # Blocking (PyTorch queues the copy and waits for its stream), chunk by chunk: `packed` is freed only once
        # its copy is done, and only one chunk's device memory is held at a time. Holding every chunk for one wait
        # at the end would hold the adapter's size again on the GPU, to overlap the next chunk's packing with a
        # copy of milliseconds.
        on_host.copy_(packed)
    else:
        on_host = packed.to("cpu")  # from the host: `packed` itself, already a copy
    del packed
    parts = on_host.split([tensors[index].numel() for index in chunk])
    for index, part in zip(chunk, parts):
        copies[index] = part.view(tensors[index].shape)
