"""Pickling DataProto for Ray without shipping more bytes, or making more copies, than needed.

torch pickles a tensor by serialising its whole storage in-band, so a slice of a big
batch would carry the whole batch. Instead each tensor travels as a numpy view of
exactly its own bytes: under pickle protocol 5 (what Ray uses) numpy hands that memory to
Ray out-of-band, and Ray writes it straight into the shared-memory object store.

On the receiving side Ray gives back read-only numpy views into the object store. That
memory is shared with every other reader, so by default each tensor is rebuilt with
exactly one copy (writable and private). Inside `borrow_received_buffers()` the tensors
are zero-copy views instead; only use it when the result is copied right away (e.g.
concatenated) and never written.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from tensordict import TensorDictBase

from protocol._tensordict_utils import KeyPath, TensorDictLayout, build_tensordict, flatten_tensordict

# torch dtypes numpy can represent directly; anything else is sent as raw integers.
_NUMPY_NATIVE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# (numpy array, torch dtype name, shape, device string)
TensorPacket = tuple[np.ndarray, str, tuple[int, ...], str]

_local = threading.local()


@contextmanager
def borrow_received_buffers() -> Iterator[None]:
    """Within this block (on this thread) received tensors are zero-copy, read-only views."""
    previous = getattr(_local, "borrow", False)
    _local.borrow = True
    try:
        yield
    finally:
        _local.borrow = previous


def is_borrowing() -> bool:
    return getattr(_local, "borrow", False)


def encode_tensor(tensor: torch.Tensor) -> TensorPacket:
    """Describe a tensor by a numpy view of its bytes (copies only if it is not contiguous or on GPU)."""
    cpu = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
    if cpu.dtype not in _NUMPY_NATIVE:
        int_dtype = _SAME_SIZE_INT.get(cpu.element_size())
        if int_dtype is None:
            raise TypeError(f"cannot transport tensors of dtype {cpu.dtype}")
        cpu = cpu.view(int_dtype)
    dtype_name = str(tensor.dtype).removeprefix("torch.")
    return cpu.numpy(), dtype_name, tuple(tensor.shape), str(tensor.device)


def decode_tensor(packet: TensorPacket) -> torch.Tensor:
    """Rebuild a tensor: one copy by default, none inside borrow_received_buffers()."""
    array, dtype_name, shape, device_name = packet
    dtype = getattr(torch, dtype_name)
    device = available_device(device_name)
    if is_borrowing() or device.type != "cpu":
        # A GPU target gets its one copy from .to(device) below.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            tensor = torch.from_numpy(array)
    else:
        tensor = torch.from_numpy(np.array(array, copy=True))
    if tensor.dtype != dtype:
        tensor = tensor.view(dtype)
    tensor = tensor.reshape(shape)
    return tensor.to(device) if device.type != "cpu" else tensor


def available_device(name: str | None) -> torch.device:
    """The recorded device if this process has it, else CPU."""
    if name is None:
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count():
            return device
        return torch.device("cpu")
    if device.type == "cpu":
        return device
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    return device if callable(is_available) and is_available() else torch.device("cpu")


def encode_tensordict(td: TensorDictBase) -> tuple[TensorDictLayout, list[tuple[KeyPath, TensorPacket]], str | None]:
    layout, leaves = flatten_tensordict(td)
    device = None if td.device is None else str(td.device)
    return layout, [(path, encode_tensor(t)) for path, t in leaves], device


def decode_tensordict(
    layout: TensorDictLayout, packets: list[tuple[KeyPath, TensorPacket]], device: str | None
) -> TensorDictBase:
    td_device = None if device is None else available_device(device)
    return build_tensordict(layout, [(path, decode_tensor(p)) for path, p in packets], td_device)
