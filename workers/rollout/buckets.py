"""Bucketing of named tensors into flat byte buffers: the unit every weight-sync path moves.

A `BucketLayout` is plain data (names, shapes, dtypes, byte offsets), so the sender and the receivers agree
on it before any bytes move; the receiver allocates one buffer per bucket and reads views out of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Offsets are rounded up to this many bytes so every view of the flat buffer is aligned for its dtype.
ALIGN_BYTES = 16
DEFAULT_BUCKET_BYTES = 512 << 20


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the start of the bucket

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class BucketLayout:
    slots: tuple[TensorSlot, ...]
    nbytes: int

    @property
    def names(self) -> list[str]:
        return [slot.name for slot in self.slots]

    def to_wire(self) -> list[Any]:
        """Plain lists, strings and ints: what vLLM's worker calls carry across processes (its msgpack turns a
        dataclass into a dict and cannot encode a torch.dtype)."""
        return [
            self.nbytes,
            [[s.name, list(s.shape), str(s.dtype).removeprefix("torch."), s.offset] for s in self.slots],
        ]

    @classmethod
    def from_wire(cls, wire: list[Any]) -> "BucketLayout":
        nbytes, slots = wire
        return cls(
            tuple(TensorSlot(name, tuple(shape), _dtype(dtype), offset) for name, shape, dtype, offset in slots), nbytes
        )


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def _aligned(offset: int) -> int:
    return (offset + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def plan_buckets(
    specs: Iterable[tuple[str, Sequence[int], torch.dtype]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[BucketLayout]:
    """Group `(name, shape, dtype)` in order into buckets of at most `bucket_bytes` (a tensor larger than
    that gets a bucket of its own). Every name appears in exactly one bucket."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[BucketLayout] = []
    slots: list[TensorSlot] = []
    end = 0
    seen: set[str] = set()
    for name, shape, dtype in specs:
        if name in seen:
            raise ValueError(f"tensor {name!r} listed twice; each name must be synced once")
        seen.add(name)
        slot = TensorSlot(name, tuple(int(s) for s in shape), dtype, 0)
        start = _aligned(end)
        if slots and start + slot.nbytes > bucket_bytes:
            buckets.append(BucketLayout(tuple(slots), end))
            slots, start = [], 0
        slots.append(TensorSlot(slot.name, slot.shape, dtype, start))
        end = start + slot.nbytes
    if slots:
        buckets.append(BucketLayout(tuple(slots), end))
    return buckets


def payload_bytes(layouts: Sequence[BucketLayout]) -> int:
    """Bytes of the tensors the buckets hold (their sizes without the alignment gaps): what a sync moves."""
    return sum(slot.nbytes for layout in layouts for slot in layout.slots)


def empty_bucket(layout: BucketLayout, device: torch.device | str) -> torch.Tensor:
    return torch.empty(layout.nbytes, dtype=torch.uint8, device=device)


def bucket_views(buffer: torch.Tensor, layout: BucketLayout) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` views into a flat uint8 `buffer` laid out as `layout` (no copies)."""
    if buffer.dtype != torch.uint8 or buffer.numel() < layout.nbytes:
        raise ValueError(
            f"bucket buffer must be uint8 with >= {layout.nbytes} bytes, got {buffer.dtype} x {buffer.numel()}"
        )
    for slot in layout.slots:
        flat = buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype)
        yield slot.name, flat.view(slot.shape)


def pack_bucket(layout: BucketLayout, tensors: Sequence[torch.Tensor], device: torch.device | str) -> torch.Tensor:
    """Copy `tensors` (in the layout's order, cast to its dtypes) into one new flat buffer on `device`."""
    if len(tensors) != len(layout.slots):
        raise ValueError(f"bucket holds {len(layout.slots)} tensors, got {len(tensors)}")
    buffer = empty_bucket(layout, device)
    for (name, view), tensor in zip(bucket_views(buffer, layout), tensors):
        if tuple(tensor.shape) != tuple(view.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the layout says {tuple(view.shape)}")
        view.copy_(tensor)
    return buffer
