"""DataProto: the batch container passed between the driver and Ray worker groups.

Same names and meanings as verl's DataProto, with safer semantics:
  * Every operation returns a new DataProto and leaves its inputs untouched, except
    `pop` and `reorder` (documented; verl code relies on both changing `self`) and explicit
    assignment into `batch` / `non_tensor_batch` / `meta_info`.
  * Memory sharing is explicit. Slicing-style operations (slice indexing, `select`
    without deepcopy, `chunk`, `split`, `to` for tensors already on the device) return
    views like torch does. All other operations (index lists/masks, `reorder`, `union`,
    `rename`, `concat`, `repeat`, padding) return tensors and arrays that do not share
    memory with their inputs. Containers (TensorDict, dicts) are never shared; the
    Python objects held by object arrays and the values in meta_info are (copy.deepcopy
    or `select(deepcopy=True)` copies them too).
  * Bad keys, lengths and index kinds raise errors that name the key and what was expected.

This file holds the container itself; splitting/joining rows is in row_operations.py, verl's extra methods
in verl_methods.py (mixins that DataProto inherits).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from protocol import disk, transport
from protocol._indexing import Index, normalize_index
from protocol._keys import BatchKey, as_key_list, format_key, require_keys
from protocol._row_checks import (
    KeyArg,
    _batch_key_list,
    _check_batch_dims,
    _common_length,
    _copied_arrays,
    _dedupe,
    _describe_tensor,
)
from protocol._tensordict_utils import flatten_tensordict, td_key
from protocol.arrays import arrays_equal, as_non_tensor_array, copy_array, tensors_equal, values_equal
from protocol.auto_padding import AUTO_PADDING_KEY
from protocol.batch_guard import guard_batch
from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.row_operations import RowOperations
from protocol.verl_methods import VerlMethods


@dataclass(eq=False)
class DataProtoItem:
    """One sample: a TensorDict row (batch_size []), its non-tensor values, and meta_info."""

    batch: TensorDictBase
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (DataProtoItem, transport.encode_tensordict(self.batch), self.non_tensor_batch, self.meta_info)


@dataclass(eq=False)
class DataProto(RowOperations, VerlMethods):
    """A batch of N samples.

    batch: TensorDict with batch_size [N] (always present, possibly without keys; pass
        None to get an empty one whose length is taken from non_tensor_batch). Storing a
        DataProto under one of its keys raises (see protocol/batch_guard.py).
    non_tensor_batch: dict of numpy arrays of length N (object dtype allowed).
    meta_info: free-form dict.
    """

    batch: TensorDictBase = None  # type: ignore[assignment]  # None -> empty batch of length N
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        if self.batch is None:
            first = next(iter(self.non_tensor_batch.values()), None)
            length = len(first) if isinstance(first, np.ndarray) and first.ndim > 0 else 0
            self.batch = TensorDict({}, batch_size=[length])
        self.check_consistency()
        guard_batch(self.batch)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from tensors (-> batch) and numpy arrays / lists (-> non_tensor_batch).

        Lists become 1-D object arrays (one element per sample, never a 2-D array).
        `num_batch_dims` must be 1 (a DataProto has one batch dimension; larger values only check that
        the tensors share their leading dims, then raise). `auto_padding=True` marks the result so
        `chunk` splits uneven lengths (see protocol/auto_padding.py). The input dicts are not modified.
        """
        tensors = dict(tensors or {})
        _check_batch_dims(tensors, num_batch_dims, non_tensors)
        non_tensor_batch = {k: as_non_tensor_array(k, v) for k, v in (non_tensors or {}).items()}
        length = _common_length(tensors, non_tensor_batch)
        batch = TensorDict(tensors, batch_size=[length]) if tensors else TensorDict({}, batch_size=[length])
        meta = dict(meta_info or {})
        if auto_padding:
            meta[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Split one dict by value type: tensors -> batch, numpy arrays / lists / tuples -> non_tensor_batch."""
        tensors: dict[str, Any] = {}
        non_tensors: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, (torch.Tensor, TensorDictBase)):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise ProtocolTypeError(
                    f"from_single_dict: value for {key!r} is {type(value).__name__}; expected a torch "
                    "tensor, numpy array, list or tuple (put scalars in meta_info)"
                )
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Check types and that every field has N = len(batch) samples."""
        if not isinstance(self.batch, TensorDictBase):
            raise ProtocolTypeError(f"DataProto.batch must be a TensorDict, got {type(self.batch).__name__}")
        if self.batch.batch_dims != 1:
            raise ProtocolValueError(
                f"DataProto.batch must have exactly one batch dimension, got batch_size {list(self.batch.batch_size)}"
            )
        if not isinstance(self.non_tensor_batch, dict):
            raise ProtocolTypeError(
                f"DataProto.non_tensor_batch must be a dict, got {type(self.non_tensor_batch).__name__}"
            )
        if not isinstance(self.meta_info, dict):
            raise ProtocolTypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")
        length = self.batch.batch_size[0]
        for key, value in self.non_tensor_batch.items():
            if not isinstance(key, str):
                raise ProtocolTypeError(f"non_tensor_batch keys must be str, got {key!r}")
            if not isinstance(value, np.ndarray):
                raise ProtocolTypeError(
                    f"non_tensor_batch[{key!r}] is {type(value).__name__}, not a numpy array "
                    "(DataProto.from_dict converts lists)"
                )
            if value.ndim == 0:
                raise ProtocolValueError(f"non_tensor_batch[{key!r}] is a 0-d array but the batch has {length} samples")
            if len(value) != length:
                raise ProtocolValueError(
                    f"non_tensor_batch[{key!r}] has length {len(value)} but the batch has {length} samples"
                )

    # ------------------------------------------------------------------ basics

    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by batch tensors (their elements, not whole underlying storages)."""
        return sum(t.numel() * t.element_size() for _, t in flatten_tensordict(self.batch)[1])

    def __repr__(self) -> str:
        fields = []
        for path, tensor in flatten_tensordict(self.batch)[1]:
            device = "" if tensor.device.type == "cpu" else f"@{tensor.device}"
            fields.append(f"{'.'.join(path)}: {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}{device}")
        arrays = [f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.non_tensor_batch.items()]
        return (
            f"DataProto(len={len(self)}, batch={{{', '.join(fields)}}}, "
            f"non_tensor_batch={{{', '.join(arrays)}}}, meta_info_keys={list(self.meta_info)})"
        )

    def __copy__(self) -> DataProto:
        """New containers, same tensors/arrays."""
        return DataProto(self.batch.clone(recurse=False), dict(self.non_tensor_batch), dict(self.meta_info))

    def __deepcopy__(self, memo: dict[int, Any]) -> DataProto:
        return DataProto(
            self.batch.clone(),
            {k: copy_array(v, deep=True) for k, v in self.non_tensor_batch.items()},
            copy.deepcopy(self.meta_info, memo),
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Tensors travel as numpy views of exactly their bytes; see protocol/transport.py. numpy arrays in
        # non_tensor_batch pass as they are: numeric ones go out-of-band and come back from Ray as read-only
        # views of the store (numpy's usual Ray behaviour, so writes fail loudly); object arrays come back private.
        return _rebuild, (DataProto, transport.encode_tensordict(self.batch), self.non_tensor_batch, self.meta_info)

    # ------------------------------------------------------------------ indexing

    def __getitem__(self, index: Index) -> DataProto | DataProtoItem:
        """int -> DataProtoItem (views); slice -> DataProto of views; index list/array/tensor
        or bool mask -> DataProto of copies. Other kinds raise TypeError."""
        position = normalize_index(index, len(self))
        if isinstance(position, int):
            return self._rows(DataProtoItem, position, position)
        if isinstance(position, slice):
            if position.step is not None and position.step < 0:  # torch views cannot step backwards
                return self._take(torch.tensor(range(*position.indices(len(self))), dtype=torch.int64))
            return self._rows(DataProto, position, position)
        return self._take(position)

    def _take(self, positions: torch.Tensor) -> DataProto:
        """Rows at `positions` (1-D int64, in range), copied."""
        return self._rows(DataProto, positions, positions.numpy())

    def _rows(self, cls: type, index: Any, array_index: Any) -> Any:
        arrays = {k: v[array_index] for k, v in self.non_tensor_batch.items()}
        return cls(batch=self.batch[index], non_tensor_batch=arrays, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ key operations

    def _batch_keys(self) -> list[BatchKey]:
        return list(self.batch.keys(include_nested=True))

    def select(
        self,
        batch_keys: KeyArg = None,
        non_tensor_batch_keys: Iterable[str] | str | None = None,
        meta_info_keys: Iterable[str] | str | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """New DataProto with only the given keys (None = all keys of that field).

        Without deepcopy the tensors/arrays are shared with self (like verl); with
        deepcopy=True everything, including meta_info values, is copied.
        """
        wanted_batch = _batch_key_list(batch_keys)
        wanted_non_tensor = as_key_list(non_tensor_batch_keys)
        wanted_meta = as_key_list(meta_info_keys)
        if wanted_batch is not None:
            require_keys("batch", wanted_batch, self._batch_keys())
        if wanted_non_tensor is not None:
            require_keys("non_tensor_batch", wanted_non_tensor, self.non_tensor_batch)
        if wanted_meta is not None:
            require_keys("meta_info", wanted_meta, self.meta_info)

        batch = self.batch if wanted_batch is None else self.batch.select(*wanted_batch)
        non_tensor = {
            k: self.non_tensor_batch[k]
            for k in (self.non_tensor_batch if wanted_non_tensor is None else wanted_non_tensor)
        }
        meta = {k: self.meta_info[k] for k in (self.meta_info if wanted_meta is None else wanted_meta)}
        if deepcopy:
            return DataProto(
                batch.clone(), {k: copy_array(v, deep=True) for k, v in non_tensor.items()}, copy.deepcopy(meta)
            )
        return DataProto(batch.clone(recurse=False), non_tensor, meta)

    def pop(
        self,
        batch_keys: KeyArg = None,
        non_tensor_batch_keys: Iterable[str] | str | None = None,
        meta_info_keys: Iterable[str] | str | None = None,
    ) -> DataProto:
        """MUTATES self: removes the given keys from self and returns them as a new DataProto.

        None means "pop nothing" for that field. All keys are checked before anything is
        removed, so a KeyError leaves self unchanged.
        """
        pop_batch = _dedupe(_batch_key_list(batch_keys) or [])
        pop_non_tensor = _dedupe(as_key_list(non_tensor_batch_keys) or [])
        pop_meta = _dedupe(as_key_list(meta_info_keys) or [])
        require_keys("batch", pop_batch, self._batch_keys())
        require_keys("non_tensor_batch", pop_non_tensor, self.non_tensor_batch)
        require_keys("meta_info", pop_meta, self.meta_info)

        batch = TensorDict({}, batch_size=self.batch.batch_size, device=self.batch.device)
        for key in pop_batch:
            batch.set(key, self.batch.pop(key))
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in pop_non_tensor}
        meta = {k: self.meta_info.pop(k) for k in pop_meta}
        return DataProto(batch, non_tensor, meta)

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """New DataProto with batch keys renamed (copied tensors; self unchanged)."""
        old = _batch_key_list(old_keys) or []
        new = _batch_key_list(new_keys) or []
        if len(old) != len(new):
            raise ProtocolValueError(
                f"rename needs as many new keys as old keys, got {len(old)} old and {len(new)} new"
            )
        existing = self._batch_keys()
        require_keys("batch", old, existing)
        if len(set(new)) != len(new):
            raise ProtocolValueError(f"rename: new keys contain duplicates: {[format_key(k) for k in new]}")
        clash = [format_key(k) for k in new if k in existing and k not in old]
        if clash:
            raise ProtocolValueError(f"rename: batch key(s) {clash} already exist")
        batch = self.batch.clone()
        values = [batch.pop(k) for k in old]
        for key, value in zip(new, values):
            batch.set(key, value)
        return DataProto(batch, _copied_arrays(self.non_tensor_batch), dict(self.meta_info))

    def union(self, other: DataProto) -> DataProto:
        """New DataProto with the keys of both (copied). Keys present in both must hold equal values."""
        if not isinstance(other, DataProto):
            raise ProtocolTypeError(f"union expects a DataProto, got {type(other).__name__}")
        if len(self) != len(other):
            raise ProtocolValueError(f"cannot union a DataProto of length {len(self)} with one of length {len(other)}")
        own_layout, own_leaves = flatten_tensordict(self.batch)
        other_layout, other_leaves = flatten_tensordict(other.batch)
        own = dict(own_leaves)
        own_nested = {p for p, _ in own_layout.nested}
        own_devices = {t.device for _, t in own_leaves}
        clashes = [p for p, _ in other_leaves if p in own_nested] + [p for p, _ in other_layout.nested if p in own]
        if clashes:
            raise ProtocolValueError(
                f"union: batch key {'.'.join(clashes[0])!r} is a tensor in one DataProto and nested in the other"
            )
        for path, tensor in other_leaves:
            if path not in own and len(own_devices) == 1 and tensor.device not in own_devices:
                (device,) = own_devices  # a mixed-device batch would fail later, far from here
                raise ProtocolValueError(
                    f"union: batch key {'.'.join(path)!r} is on {tensor.device} but this DataProto's tensors are on "
                    f"{device}; move one of them first, e.g. other.to({str(device)!r})"
                )
            if path in own and own[path].dtype != tensor.dtype:
                raise ProtocolValueError(
                    f"union: batch key {'.'.join(path)!r} is in both DataProtos with different dtypes "
                    f"({_describe_tensor(own[path])} vs {_describe_tensor(tensor)})"
                )
            if path in own and not tensors_equal(own[path], tensor):
                raise ProtocolValueError(
                    f"union: batch key {'.'.join(path)!r} is in both DataProtos with different values"
                )
        for key, array in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not arrays_equal(self.non_tensor_batch[key], array):
                raise ProtocolValueError(
                    f"union: non_tensor_batch key {key!r} is in both DataProtos with different values"
                )
        for key, value in other.meta_info.items():
            if key in self.meta_info and not values_equal(self.meta_info[key], value):
                raise ProtocolValueError(f"union: meta_info key {key!r} is in both DataProtos with different values")

        batch = self.batch.clone()
        for path, batch_size in other_layout.nested:  # keep extra batch dims of nested TensorDicts
            if path not in own_nested:
                batch.set(td_key(path), TensorDict({}, batch_size=batch_size, device=batch.device))
        for path, tensor in other_leaves:
            if path not in own:
                batch.set(td_key(path), tensor.clone())
        non_tensor = _copied_arrays(self.non_tensor_batch)
        non_tensor.update({k: copy_array(v) for k, v in other.non_tensor_batch.items() if k not in non_tensor})
        meta = {**self.meta_info, **{k: v for k, v in other.meta_info.items() if k not in self.meta_info}}
        return DataProto(batch, non_tensor, meta)

    # ------------------------------------------------------------------ device

    def to(self, device: str | torch.device) -> DataProto:
        """New DataProto with tensors on `device` (tensors already there are shared, like torch)."""
        batch = self.batch.to(device)
        if batch is self.batch:
            batch = batch.clone(recurse=False)
        return DataProto(batch, dict(self.non_tensor_batch), dict(self.meta_info))

    # ------------------------------------------------------------------ disk

    def save_to_disk(self, path: str | os.PathLike[str]) -> None:
        """Write one safetensors file (no pickle); see protocol/disk.py for the format."""
        disk.write_dataproto_file(self.batch, self.non_tensor_batch, self.meta_info, path)

    @staticmethod
    def load_from_disk(path: str | os.PathLike[str]) -> DataProto:
        """Read a file written by save_to_disk (tensors on CPU)."""
        return DataProto(**disk.read_dataproto_file(path))


def _rebuild(
    cls: type[DataProto] | type[DataProtoItem], encoded_batch: tuple, non_tensor_batch: dict, meta_info: dict
) -> DataProto | DataProtoItem:
    """Unpickle a DataProto or a DataProtoItem (their `__reduce__`)."""
    return cls(
        batch=transport.decode_tensordict(*encoded_batch), non_tensor_batch=non_tensor_batch, meta_info=meta_info
    )


__all__ = ["DataProto", "DataProtoItem"]
