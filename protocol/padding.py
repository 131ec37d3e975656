"""Pad a DataProto so it splits evenly across workers, and strip the padding afterwards.

Function forms of `DataProto.pad_to_divisor` / `DataProto.unpad` (the names verl users call).
"""

from __future__ import annotations

from protocol.data_proto import DataProto


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Return (a new DataProto whose length is a multiple of size_divisor, pad_size); see DataProto.pad_to_divisor."""
    return data.pad_to_divisor(size_divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last pad_size rows; see DataProto.unpad."""
    return data.unpad(pad_size)
