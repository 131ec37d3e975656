"""Length, key and leaf checks behind DataProto's constructors and operations (messages name the key)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from protocol._keys import BatchKey, as_key_list, normalize_batch_key
from protocol._tensordict_utils import flatten_tensordict
from protocol.arrays import copy_array
from protocol.errors import ProtocolTypeError, ProtocolValueError

KeyArg = str | tuple[str, ...] | Iterable[BatchKey] | None


def _common_length(tensors: dict[str, Any], non_tensors: dict[str, np.ndarray]) -> int:
    """The shared first dimension of all values; errors name the disagreeing key."""
    reference: tuple[str, int] | None = None
    for kind, values in (("tensor", tensors), ("non_tensor", non_tensors)):
        for key, value in values.items():
            if kind == "tensor" and not isinstance(value, (torch.Tensor, TensorDictBase)):
                raise ProtocolTypeError(f"tensors[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
            shape = value.batch_size if isinstance(value, TensorDictBase) else value.shape
            if len(shape) == 0:
                raise ProtocolValueError(f"{kind}s[{key!r}] is 0-dimensional; values need a leading batch dimension")
            if reference is None:
                reference = (key, int(shape[0]))
            elif shape[0] != reference[1]:
                raise ProtocolValueError(
                    f"{kind}s[{key!r}] has length {shape[0]} but {reference[0]!r} has length {reference[1]}"
                )
    return reference[1] if reference else 0


def _describe_tensor(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device}"


def _check_concat_leaves(batches: list[TensorDictBase]) -> None:
    """Same dtype, device and per-row shape for each batch key, else an error naming the key and item
    (torch.cat would silently promote dtypes, and its shape/device errors do not name the key)."""
    first = dict(flatten_tensordict(batches[0])[1])
    for i, batch in enumerate(batches[1:], start=1):
        for path, tensor in flatten_tensordict(batch)[1]:
            ref = first[path]
            if ref.dtype != tensor.dtype or ref.device != tensor.device or ref.shape[1:] != tensor.shape[1:]:
                raise ProtocolValueError(
                    f"concat: batch key {'.'.join(path)!r} is {_describe_tensor(ref)} in item 0 but "
                    f"{_describe_tensor(tensor)} in item {i}; convert one of them first (tensor.to(...), padding)"
                )


def _batch_key_list(keys: KeyArg) -> list[BatchKey] | None:
    listed = as_key_list(keys)
    return None if listed is None else [normalize_batch_key(k) for k in listed]


def _dedupe(keys: list[Any]) -> list[Any]:
    return list(dict.fromkeys(keys))


def _copied_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: copy_array(v) for k, v in arrays.items()}


def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ProtocolValueError(f"{name} must be a positive int, got {value!r}")


def _check_batch_dims(tensors: dict[str, Any], num_batch_dims: int, non_tensors: Any) -> None:
    """from_dict's num_batch_dims: positive, the tensors agree on that many leading dims, and it is 1."""
    _require_positive_int("num_batch_dims", num_batch_dims)
    if num_batch_dims == 1:
        return
    leading = {k: tuple(v.shape[:num_batch_dims]) for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    if len(set(leading.values())) > 1:
        raise ProtocolValueError(f"from_dict: tensors disagree on their first {num_batch_dims} dims: {leading}")
    raise ProtocolValueError(
        f"from_dict: num_batch_dims={num_batch_dims}, but a DataProto has exactly one batch dimension"
        + (" (and non_tensors need it too)" if non_tensors else "")
        + "; build it with num_batch_dims=1 (extra dims stay per-sample dims), or flatten the leading dims "
        "first (see protocol.fold_batch_dim / unfold_batch_dim)"
    )
