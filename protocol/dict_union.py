"""Union of two batches' TensorDicts or numpy dicts, the pieces `DataProto.union` is made of.

Both return a new container and leave their inputs unchanged; a key present in both must hold equal
values (NaN equal to NaN; tensors of different dtypes compare by value, as verl's `Tensor.equal` does), else
`ProtocolValueError` (also an AssertionError, like verl's assert) names the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from protocol.arrays import arrays_equal, tensors_equal
from protocol.errors import ProtocolTypeError, ProtocolValueError


def union_tensor_dict(tensor_dict1: TensorDictBase, tensor_dict2: TensorDictBase) -> TensorDictBase:
    """A TensorDict with the top-level keys of both (tensors shared, not copied)."""
    for name, td in (("tensor_dict1", tensor_dict1), ("tensor_dict2", tensor_dict2)):
        if not isinstance(td, TensorDictBase):
            raise ProtocolTypeError(f"union_tensor_dict: {name} must be a TensorDict, got {type(td).__name__}")
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ProtocolValueError(
            "union_tensor_dict: the two TensorDicts must have identical batch sizes, got "
            f"{list(tensor_dict1.batch_size)} and {list(tensor_dict2.batch_size)}"
        )
    merged = tensor_dict1.clone(recurse=False)
    for key, value in tensor_dict2.items():
        if key not in merged.keys():
            merged.set(key, value)
        elif not _leaves_equal(merged.get(key), value):
            raise ProtocolValueError(
                f"union_tensor_dict: key {key!r} is in tensor_dict1 and tensor_dict2 with different values"
            )
    return merged


def _leaves_equal(a: Any, b: Any) -> bool:
    if isinstance(a, TensorDictBase) or isinstance(b, TensorDictBase):
        return (
            isinstance(a, TensorDictBase)
            and isinstance(b, TensorDictBase)
            and set(a.keys()) == set(b.keys())
            and all(_leaves_equal(a.get(k), b.get(k)) for k in a.keys())
        )
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype and a.shape == b.shape and a.device == b.device:
        return bool(torch.equal(a, b))  # like verl: equal values agree whatever their dtypes
    return tensors_equal(a, b)


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A dict with the keys of both (arrays shared, not copied)."""
    merged = dict(tensor_dict1)
    for key, value in tensor_dict2.items():
        for name, array in (("tensor_dict1", tensor_dict1.get(key)), ("tensor_dict2", value)):
            if array is not None and not isinstance(array, np.ndarray):
                raise ProtocolTypeError(f"union_numpy_dict: {name}[{key!r}] must be a numpy array, got {type(array).__name__}")
        if key in merged and not arrays_equal(merged[key], value):
            raise ProtocolValueError(f"union_numpy_dict: key {key!r} is in tensor_dict1 and tensor_dict2 with different values")
        merged[key] = value
    return merged


__all__ = ["union_numpy_dict", "union_tensor_dict"]
