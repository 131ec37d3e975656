"""Many small device tensors to host memory in a few large copies, their |w| summed on the way.

A mixture of experts' LoRA adapter in vLLM is tens of thousands of small factors (48 layers x 128 experts x 3
projections x A and B at 30B-A3B). Copied one by one, each is a synchronous device->host copy and each sum a
handful of kernels; packed into chunks, each chunk is one copy and one sum, and the host tensors are views of it.
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
    """Host copies of `tensors` (same shapes, dtypes and values, in order: views of packed chunks), each chunk's
    |w| added to `fingerprint` while still on its device."""
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


def _key(tensor: torch.Tensor) -> tuple[torch.device, torch.dtype]:
    return tensor.device, tensor.dtype  # one chunk holds one dtype from one device


def _copy_chunk(
    tensors: Sequence[torch.Tensor], chunk: list[int], copies: list[torch.Tensor], fingerprint: WeightFingerprint
) -> None:
    packed = torch.cat([tensors[index].detach().reshape(-1) for index in chunk])
    fingerprint.add([packed])
    on_host = packed.to("cpu")
    del packed
    parts = on_host.split([tensors[index].numel() for index in chunk])
    for index, part in zip(chunk, parts):
        copies[index] = part.view(tensors[index].shape)
