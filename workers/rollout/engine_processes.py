"""What an engine in processes of its own needs from its owner (a hybrid group's tensor-parallel engine,
workers/rollout/engine_group.py): the GPUs its processes see when they start, and weights as bytes, since
vLLM's RPC to its workers carries bytes, not tensors."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def devices_visible(devices: str | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES set to `devices` while the engine's processes start (they inherit it); this process's
    own CUDA context, already made, keeps its one GPU."""
    if devices is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def transfer_chunks(pairs: Iterable[tuple[str, torch.Tensor]], limit_bytes: int) -> Iterator[bytes]:
    """`(name, tensor)` pairs as safetensors bytes of about `limit_bytes` each: what goes to an engine in processes
    of its own (its RPC carries bytes, not tensors), one chunk per call, so host memory holds one at a time."""
    from safetensors.torch import save

    chunk: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in pairs:
        host = tensor.detach().to("cpu", copy=True).contiguous()  # a copy: tied weights must not share storage
        chunk[name] = host
        size += host.numel() * host.element_size()
        if size >= limit_bytes:
            yield save(chunk)
            chunk, size = {}, 0
    if chunk:
        yield save(chunk)
