"""Pad a DataProto so it splits evenly across workers, and strip the padding afterwards."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from protocol.data_proto import DataProto


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Return (a new DataProto whose length is a multiple of size_divisor, pad_size).

    Padding rows repeat rows from the start (cyclically when the pad is longer than the
    data), so they are real samples any worker can process. The result never shares
    memory with `data`, even when no padding is needed.
    """
    if isinstance(size_divisor, bool) or not isinstance(size_divisor, int) or size_divisor < 1:
        raise ValueError(f"size_divisor must be a positive int, got {size_divisor!r}")
    length = len(data)
    if length == 0:
        raise ValueError("cannot pad an empty DataProto: there are no rows to repeat")
    pad_size = (-length) % size_divisor
    positions = torch.cat([torch.arange(length), torch.arange(pad_size) % length])
    return data[positions], pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last pad_size rows; returns a new DataProto that does not share memory with `data`."""
    if isinstance(pad_size, bool) or not isinstance(pad_size, int) or not 0 <= pad_size <= len(data):
        raise ValueError(f"pad_size must be an int in [0, {len(data)}], got {pad_size!r}")
    return data[torch.arange(len(data) - pad_size)]
