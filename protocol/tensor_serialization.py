"""Tensors and TensorDicts as plain (dtype name, shape, bytes) tuples: verl's numpy serialization helpers.

Formats (what verl's `serialize_*` functions produce, so data written by either side reads on the other):
  * one tensor:  `(dtype name without "torch.", shape, 1-D uint8 numpy array of its bytes)`
  * TensorDict:  `(batch_size tuple, device string or None, {key: encoded tensor})`, where a jagged nested
    tensor is encoded as `(layout name, [encoded component, ...])`.
Only top-level tensor keys are supported (as in verl); anything else raises naming the key.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.transport import available_device

EncodedTensor = tuple[str, tuple[int, ...], np.ndarray]
EncodedTensorDict = tuple[tuple[int, ...], str | None, dict[str, Any]]


def serialize_single_tensor(obj: torch.Tensor) -> EncodedTensor:
    """`(dtype name, shape, uint8 bytes)` of a dense tensor (moved to CPU and made contiguous first)."""
    if not isinstance(obj, torch.Tensor):
        raise ProtocolTypeError(f"serialize_single_tensor expects a torch.Tensor, got {type(obj).__name__}")
    if obj.is_nested:
        raise ProtocolTypeError(
            "serialize_single_tensor takes a dense tensor; serialize_tensordict encodes nested ones"
        )
    flat = obj.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    return str(obj.dtype).removeprefix("torch."), obj.shape, flat.view(torch.uint8).numpy()


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """Inverse of `serialize_single_tensor`: a new CPU tensor owning a copy of the bytes."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolValueError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype name")
    raw = bytes(memoryview(data))
    expected = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if len(raw) != expected:
        raise ProtocolValueError(
            f"deserialize_single_tensor: {len(raw)} bytes do not hold a {dtype_name} tensor of shape {list(shape)} "
            f"({expected} bytes)"
        )
    if not raw:  # torch.frombuffer refuses an empty buffer
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(tuple(shape))


def serialize_tensordict(batch: TensorDictBase) -> EncodedTensorDict:
    """`(batch_size, device, {key: encoded})` of a TensorDict whose values are tensors (jagged nested allowed)."""
    if not isinstance(batch, TensorDictBase):
        raise ProtocolTypeError(f"serialize_tensordict expects a TensorDict, got {type(batch).__name__}")
    encoded: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ProtocolTypeError(
                f"serialize_tensordict: {key!r} holds {type(value).__name__}; only tensors (dense or nested) at the "
                "top level can be encoded"
            )
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(part) for part in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: Any) -> TensorDict:
    """Inverse of `serialize_tensordict` (on the recorded device when this process has it, else on CPU)."""
    batch_size, device, encoded = arr
    values: dict[str, torch.Tensor] = {}
    for key, value in encoded.items():
        if len(value) == 3:
            values[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout_name, parts = value
            layout = getattr(torch, str(layout_name), None)
            if not isinstance(layout, torch.layout):
                raise ProtocolValueError(f"deserialize_tensordict: {key!r} has unknown layout {layout_name!r}")
            values[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts], layout=layout)
        else:
            raise ProtocolValueError(
                f"deserialize_tensordict: {key!r} is encoded with {len(value)} fields; expected 3 (a tensor) or 2 "
                "(layout and components of a nested tensor)"
            )
    target = None if device is None else available_device(device)
    return TensorDict(values, batch_size=list(batch_size), device=target)


__all__ = ["deserialize_single_tensor", "deserialize_tensordict", "serialize_single_tensor", "serialize_tensordict"]
