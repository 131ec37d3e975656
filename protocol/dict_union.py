"""Union of two batches' TensorDicts or numpy dicts, the pieces `DataProto.union` is made of.

Both add the second container's keys to the first in place and return it, as verl's do (ported code that
ignores the return value keeps working); a key present in both must hold equal
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
    """`tensor_dict1` with the top-level keys of `tensor_dict2` added (tensors shared, not copied); all keys
    are checked before any is added, so a conflict leaves `tensor_dict1` unchanged."""
    for name, td in (("tensor_dict1", tensor_dict1), ("tensor_dict2", tensor_dict2)):
        if not isinstance(td, TensorDictBase):
            raise ProtocolTypeError(f"union_tensor_dict: {name} must be a TensorDict, got {type(td).__name__}")
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ProtocolValueError(
            "union_tensor_dict: the two TensorDicts must have identical batch sizes, got "
            f"{list(tensor_dict1.batch_size)} and {list(tensor_dict2.batch_size)}"
        )
    present = set(tensor_dict1.keys())
    for key, value in tensor_dict2.items():
        if key in present and not _leaves_equal(tensor_dict1.get(key), value):
            raise ProtocolValueError(
                f"union_tensor_dict: key {key!r} is in tensor_dict1 and tensor_dict2 with different values"
            )
    for key, value in tensor_dict2.items():
        if key not in present:
            tensor_dict1.set(key, value)
    return tensor_dict1


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
    """`tensor_dict1` with the keys of `tensor_dict2` added (arrays shared, not copied); all keys are checked
    before any is added, so a conflict leaves `tensor_dict1` unchanged."""
    for key, value in tensor_dict2.items():
        for name, array in (("tensor_dict1", tensor_dict1.get(key)), ("tensor_dict2", value)):
            if array is not None and not isinstance(array, np.ndarray):
                raise ProtocolTypeError(
                    f"union_numpy_dict: {name}[{key!r}] must be a numpy array, got {type(array).__name__}"
                )
        if key in tensor_dict1 and not arrays_equal(tensor_dict1[key], value):
            raise ProtocolValueError(
                f"union_numpy_dict: key {key!r} is in tensor_dict1 and tensor_dict2 with different values"
            )
    tensor_dict1.update(tensor_dict2)
    return tensor_dict1


__all__ = ["union_numpy_dict", "union_tensor_dict"]
