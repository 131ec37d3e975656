"""numpy helpers for non_tensor_batch: safe object arrays, copies and equality."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from protocol.errors import ProtocolTypeError


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Build a 1-D object array with one element per item.

    np.array(list_of_lists, dtype=object) would silently build a 2-D array when the
    inner lists happen to have equal lengths; filling a preallocated array never does.
    """
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def as_non_tensor_array(key: str, value: Any) -> np.ndarray:
    """Convert a user value for non_tensor_batch[key] to an ndarray (lists -> object arrays)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return to_object_array(value)
    raise ProtocolTypeError(
        f"non_tensor_batch[{key!r}] must be a numpy array, list or tuple, got {type(value).__name__}"
    )


def copy_array(array: np.ndarray, deep: bool = False) -> np.ndarray:
    """Copy array memory; with deep=True also deep-copy the Python objects of object arrays."""
    if deep and array.dtype == object:
        return copy.deepcopy(array)
    return array.copy()


def values_equal(a: Any, b: Any) -> bool:
    """Equality that never raises on array-valued elements (used by union for conflicts)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tensors_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and arrays_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(values_equal, a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN == NaN, as for arrays and tensors
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a plain bool are treated as different
        return False


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Shape/dtype/value equality; NaNs compare equal so identical data is never a conflict."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == object:
        return all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Shape/dtype/value equality for tensors, NaN == NaN (cheap identity check first)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    return False
