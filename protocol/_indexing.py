"""Turn the index kinds DataProto accepts into an int, a slice or a LongTensor of positions."""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import torch

Index = Union[int, slice, list, np.ndarray, torch.Tensor]

VALID_INDEX_KINDS = (
    "int, slice, list of ints or bools, numpy int/bool array, torch integer/bool tensor"
)


def normalize_index(index: Any, length: int) -> int | slice | torch.Tensor:
    """Return a non-negative int, a slice, or a 1-D int64 CPU tensor of in-range positions.

    Bool masks become positions, negative positions are wrapped once (like numpy), and
    out-of-range positions raise IndexError instead of failing deep inside tensordict.
    """
    if isinstance(index, slice):
        return index
    if isinstance(index, (bool, np.bool_)):
        raise TypeError(f"DataProto cannot be indexed by a bool scalar; valid index kinds: {VALID_INDEX_KINDS}")
    if isinstance(index, (int, np.integer)):
        return _check_int(int(index), length)
    if (
        isinstance(index, torch.Tensor)
        and index.ndim == 0
        and not index.is_floating_point()
        and index.dtype != torch.bool
    ):
        return _check_int(int(index.item()), length)
    if isinstance(index, (list, tuple)):
        if len(index) == 0:
            return torch.empty(0, dtype=torch.int64)
        if all(isinstance(i, (bool, np.bool_)) for i in index):
            return _mask_to_positions(torch.tensor(index, dtype=torch.bool), length)
        if all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in index):
            return _check_positions(torch.tensor([int(i) for i in index], dtype=torch.int64), length)
        raise TypeError(
            f"DataProto index lists must hold only ints or only bools; valid index kinds: {VALID_INDEX_KINDS}"
        )
    if isinstance(index, np.ndarray):
        if index.dtype == np.bool_:
            return _mask_to_positions(torch.from_numpy(np.ascontiguousarray(index)), length)
        if index.dtype.kind in "iu":
            return _check_positions(torch.from_numpy(index.astype(np.int64)), length)
        raise TypeError(
            f"DataProto cannot be indexed by a numpy array of dtype {index.dtype}; "
            f"valid index kinds: {VALID_INDEX_KINDS}"
        )
    if isinstance(index, torch.Tensor):
        if index.dtype == torch.bool:
            return _mask_to_positions(index.cpu(), length)
        if not index.is_floating_point() and not index.is_complex():
            return _check_positions(index.cpu().to(torch.int64), length)
        raise TypeError(
            f"DataProto cannot be indexed by a torch tensor of dtype {index.dtype}; "
            f"valid index kinds: {VALID_INDEX_KINDS}"
        )
    raise TypeError(f"DataProto cannot be indexed by {type(index).__name__}; valid index kinds: {VALID_INDEX_KINDS}")


def _check_int(i: int, length: int) -> int:
    if not -length <= i < length:
        raise IndexError(f"index {i} is out of range for DataProto of length {length}")
    return i + length if i < 0 else i


def _mask_to_positions(mask: torch.Tensor, length: int) -> torch.Tensor:
    if mask.ndim != 1 or mask.shape[0] != length:
        raise IndexError(f"bool mask has shape {tuple(mask.shape)} but DataProto has length {length}")
    return mask.nonzero().flatten()


def _check_positions(positions: torch.Tensor, length: int) -> torch.Tensor:
    if positions.ndim != 1:
        raise IndexError(f"index arrays must be 1-D, got shape {tuple(positions.shape)}")
    if positions.numel() and (positions.min() < -length or positions.max() >= length):
        raise IndexError(f"index array has values outside [-{length}, {length}) for DataProto of length {length}")
    return torch.where(positions < 0, positions + length, positions)
