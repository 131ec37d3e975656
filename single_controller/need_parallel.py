"""`NeedParallel`: marks a plain argument (list, tensor, array, dict) to be split across a group's workers."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Literal, Sequence

import numpy as np
import torch

SplitType = Literal["batch", "seq"]
_VALID_TYPES = ("batch", "seq")


@dataclass(frozen=True)
class NeedParallel:
    """Wrap an argument so it is split across the workers instead of sent whole.

    `type="batch"` splits along the first axis (samples); `type="seq"` splits along the sequence axis
    (axis 1 of tensors and arrays, or each inner sequence of a list of sequences) for sequence parallelism.
    """

    value: Any
    type: SplitType = "batch"

    def __post_init__(self) -> None:
        if self.type not in _VALID_TYPES:
            raise ValueError(f"NeedParallel type must be one of {_VALID_TYPES}, got {self.type!r}")


def _bounds(length: int, parts: int) -> list[tuple[int, int]]:
    # Contiguous near-equal parts; the first `length % parts` parts get one extra item.
    base, extra = divmod(length, parts)
    ends = list(accumulate(base + (i < extra) for i in range(parts)))
    return list(zip([0, *ends[:-1]], ends))


def split_value(value: Any, parts: int, split_type: SplitType = "batch") -> list[Any]:
    """Split `value` into `parts` contiguous pieces along the batch or sequence axis."""
    from protocol import DataProto

    if isinstance(value, dict):
        per_key = {k: split_value(v, parts, split_type) for k, v in value.items()}
        return [{k: pieces[i] for k, pieces in per_key.items()} for i in range(parts)]
    if split_type == "seq":
        if isinstance(value, torch.Tensor):
            return list(torch.tensor_split(value, parts, dim=1))
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            return list(np.array_split(value, parts, axis=1))
        if isinstance(value, (list, tuple)) and all(isinstance(s, (list, tuple)) for s in value):
            split_seqs = [[s[a:b] for a, b in _bounds(len(s), parts)] for s in value]
            return [[pieces[i] for pieces in split_seqs] for i in range(parts)]
        raise TypeError(
            f"NeedParallel(type='seq') splits tensors, arrays with >=2 dims or lists of sequences; "
            f"got {type(value).__name__}"
        )
    if isinstance(value, torch.Tensor):
        return list(torch.tensor_split(value, parts, dim=0))
    if isinstance(value, np.ndarray):
        return list(np.array_split(value, parts, axis=0))
    if isinstance(value, (DataProto, list, tuple)):
        return [value[a:b] for a, b in _bounds(len(value), parts)]
    raise TypeError(
        "NeedParallel(type='batch') splits lists, tuples, tensors, numpy arrays, DataProto or dicts of "
        f"those; got {type(value).__name__}"
    )


def join_values(parts: Sequence[Any], split_type: SplitType = "batch") -> Any:
    """Re-join per-worker outputs split with `split_value` (the inverse for the supported types)."""
    from protocol import DataProto

    first = parts[0]
    if isinstance(first, dict):
        return {k: join_values([p[k] for p in parts], split_type) for k in first}
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts), dim=1 if split_type == "seq" else 0)
    if isinstance(first, np.ndarray):
        return np.concatenate(list(parts), axis=1 if split_type == "seq" else 0)
    if isinstance(first, DataProto):
        return DataProto.concat(list(parts))
    if isinstance(first, (list, tuple)):
        if split_type == "seq":
            return [type(seqs[0])(item for seq in seqs for item in seq) for seqs in zip(*parts)]
        return [item for p in parts for item in p]
    # Scalars and other outputs cannot be joined: give them back one per worker.
    return list(parts)
