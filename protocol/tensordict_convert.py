"""DataProto <-> one TensorDict, the form verl's TensorDict-based workers take.

Layout of the TensorDict (batch size [N]):
  * every `batch` key as it is (tensors, nested TensorDicts);
  * every `non_tensor_batch` column as a `NonTensorStack` with one entry per row, so rows may hold nested
    lists and dicts (what agent loops store: messages, per-turn scores);
  * every `meta_info` key as a `NonTensorData` (one value for the whole batch).
A key may appear in only one of the three. Converting back gives `non_tensor_batch` columns as 1-D object
arrays, one element per row (numeric or string columns therefore come back with dtype object).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from protocol.arrays import to_object_array
from protocol.errors import ProtocolTypeError, ProtocolValueError


def dataproto_to_tensordict(
    batch: TensorDictBase, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any], length: int
) -> TensorDict:
    """The TensorDict holding a DataProto's three fields (tensors shared, not copied)."""
    tensor_keys = set(batch.keys())
    for name, keys in (("non_tensor_batch", non_tensor_batch), ("meta_info", meta_info)):
        clash = sorted(tensor_keys & set(keys))
        if clash:
            raise ProtocolValueError(f"to_tensordict: keys {clash} are in both batch and {name}; rename one of them")
        tensor_keys |= set(keys)
    # A plain TensorDict (not DataProto's guarded batch class): the result leaves the DataProto.
    td = TensorDict(dict(batch.items()), batch_size=batch.batch_size, device=batch.device)
    for key, column in non_tensor_batch.items():
        td.set(key, NonTensorStack.from_list([NonTensorData(item) for item in column]))
    for key, value in meta_info.items():
        td.set(key, NonTensorData(value, batch_size=td.batch_size))
    if td.batch_size[0] != length:
        raise ProtocolValueError(f"to_tensordict: batch has {td.batch_size[0]} rows but the DataProto has {length}")
    return td


def tensordict_to_fields(
    tensor_dict: TensorDictBase, meta_info: dict[str, Any] | None, num_batch_dims: int
) -> tuple[TensorDict, dict[str, np.ndarray], dict[str, Any]]:
    """`(batch, non_tensor_batch, meta_info)` read from a TensorDict laid out as `dataproto_to_tensordict` writes."""
    if not isinstance(tensor_dict, TensorDictBase):
        raise ProtocolTypeError(f"from_tensordict expects a TensorDict, got {type(tensor_dict).__name__}")
    if isinstance(num_batch_dims, bool) or not isinstance(num_batch_dims, int) or num_batch_dims != 1:
        raise ProtocolValueError(
            f"from_tensordict: num_batch_dims={num_batch_dims!r}, but a DataProto has exactly one batch dimension; "
            "pass num_batch_dims=1 (or fold the extra dims first, see protocol.unfold_batch_dim)"
        )
    tensors: dict[str, Any] = {}
    columns: dict[str, np.ndarray] = {}
    meta = dict(meta_info or {})
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            columns[key] = to_object_array(value.tolist())
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        elif isinstance(value, (torch.Tensor, TensorDictBase)):
            tensors[key] = value
        else:
            raise ProtocolTypeError(
                f"from_tensordict: {key!r} holds {type(value).__name__}, which a DataProto cannot store"
            )
    length = _row_count(tensor_dict, tensors, columns)
    batch = TensorDict(tensors, batch_size=[length], device=tensor_dict.device)
    return batch, columns, meta


def _row_count(tensor_dict: TensorDictBase, tensors: dict[str, Any], columns: dict[str, np.ndarray]) -> int:
    """Rows: the TensorDict's first batch dim, else the first tensor's or column's length, else 0."""
    if tensor_dict.batch_dims >= 1:
        return int(tensor_dict.batch_size[0])
    for value in tensors.values():
        shape = value.batch_size if isinstance(value, TensorDictBase) else value.shape
        if len(shape):
            return int(shape[0])
    return next((len(column) for column in columns.values()), 0)


__all__ = ["dataproto_to_tensordict", "tensordict_to_fields"]
