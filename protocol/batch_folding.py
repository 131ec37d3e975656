"""Fold a DataProto's rows into groups and back: [N, ...] <-> [N // g rows of g samples, ...].

`fold_batch_dim(data, n)` keeps one batch dimension of n rows; every field gains a second dimension of
N // n (e.g. the responses of one prompt side by side). `unfold_batch_dim` flattens it back. Both return a
new DataProto (the tensors are views where torch can reshape without copying) and leave `data` unchanged.
"""

from __future__ import annotations

import numpy as np
from tensordict import TensorDict

from protocol._row_checks import _require_positive_int
from protocol._tensordict_utils import flatten_tensordict
from protocol.data_proto import DataProto
from protocol.errors import ProtocolValueError


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """[N, ...] -> [new_batch_size, N // new_batch_size, ...] for every batch tensor and numpy array."""
    length = len(data)
    _require_positive_int("fold_batch_dim: new_batch_size", new_batch_size)
    if length % new_batch_size:
        raise ProtocolValueError(f"fold_batch_dim: length {length} is not divisible by new_batch_size {new_batch_size}")
    group = length // new_batch_size
    batch = data.batch.reshape(new_batch_size, group)
    batch.batch_size = [new_batch_size]
    non_tensor = {k: np.reshape(v, (new_batch_size, group, *v.shape[1:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch, non_tensor, dict(data.meta_info))


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Flatten the first `batch_dims` dims of every field into the batch dimension (inverse of fold)."""
    _require_positive_int("unfold_batch_dim: batch_dims", batch_dims)
    layout, leaves = flatten_tensordict(data.batch)
    if layout.nested:
        raise ProtocolValueError(
            f"unfold_batch_dim: nested batch keys {['.'.join(p) for p, _ in layout.nested]} are not supported"
        )
    fields = [(".".join(path), tuple(t.shape)) for path, t in leaves]
    fields += [(k, v.shape) for k, v in data.non_tensor_batch.items()]
    leading = {shape[:batch_dims] for _, shape in fields}
    if len(leading) != 1 or any(len(shape) < batch_dims for _, shape in fields):
        described = ", ".join(f"{name}: {list(shape)}" for name, shape in fields) or "no fields"
        raise ProtocolValueError(f"unfold_batch_dim: fields must share their first {batch_dims} dims ({described})")
    (dims,) = leading
    rows = int(np.prod(dims))
    if leaves:
        batch = data.batch.clone(recurse=False)
        batch.batch_size = list(dims)
        batch = batch.reshape(rows)
    else:
        batch = TensorDict({}, batch_size=[rows], device=data.batch.device)
    non_tensor = {k: np.reshape(v, (rows, *v.shape[batch_dims:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch, non_tensor, dict(data.meta_info))

__all__ = ["fold_batch_dim", "unfold_batch_dim"]
