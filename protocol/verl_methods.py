"""DataProto methods that code written against verl's DataProto calls, with this project's semantics.

They live in a mixin below `data_proto.py` so the core file keeps the container itself. Like every
DataProto operation they return new DataProtos and leave `self` untouched; where verl changes its input
in place (`padding`), the method says what to call instead. `torch.cat(list_of_dataprotos)` works as
`DataProto.concat(list_of_dataprotos)`, as verl-style collect functions write it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from protocol._row_checks import _require_positive_int
from protocol._tensordict_utils import flatten_tensordict
from protocol.auto_padding import AUTO_PADDING_KEY, DataProtoConfig
from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.tensordict_convert import dataproto_to_tensordict, tensordict_to_fields

# torch functions that concatenate a sequence; on DataProtos they mean DataProto.concat.
_CONCAT_FUNCTIONS = (torch.cat, torch.concat, torch.concatenate)

RepeatCounts = Sequence[int] | np.ndarray | torch.Tensor


def _repeat_counts(repeat_times: Any, length: int) -> torch.Tensor:
    """Validate per-row repeat counts: one non-negative int per row, as a 1-D int64 tensor."""
    if isinstance(repeat_times, (list, tuple)):
        counts = torch.as_tensor(list(repeat_times), dtype=torch.int64)
    elif isinstance(repeat_times, np.ndarray):
        counts = torch.from_numpy(np.asarray(repeat_times))
    elif isinstance(repeat_times, torch.Tensor):
        counts = repeat_times.detach().cpu()
    else:
        raise ProtocolTypeError(
            f"sample_level_repeat: repeat_times must be a list, tuple, numpy array or tensor of ints, got "
            f"{type(repeat_times).__name__}"
        )
    if counts.ndim != 1 or counts.is_floating_point() or counts.dtype == torch.bool:
        raise ProtocolValueError(
            "sample_level_repeat: repeat_times must be 1-D integers, "
            f"got dtype {counts.dtype} shape {list(counts.shape)}"
        )
    if len(counts) != length:
        raise ProtocolValueError(f"sample_level_repeat: got {len(counts)} repeat counts for {length} rows")
    if len(counts) and int(counts.min()) < 0:
        raise ProtocolValueError(f"sample_level_repeat: repeat counts must be >= 0, got {counts.tolist()[:20]}")
    return counts.to(torch.int64)


def _concat_arguments(args: tuple, kwargs: dict) -> tuple[list[Any], int]:
    """The sequence and dim of a torch.cat / concat / concatenate call (dim may be spelled `axis`)."""
    if "out" in kwargs:
        raise ProtocolTypeError("torch.cat(..., out=...) is not supported for DataProtos; use the returned DataProto")
    if not args and "tensors" not in kwargs:
        raise ProtocolTypeError("torch.cat needs a sequence of DataProtos")
    items = list(args[0] if args else kwargs["tensors"])
    dim = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0))
    return items, dim


class VerlMethods:
    """Mixed into DataProto (which provides batch, non_tensor_batch, meta_info, __getitem__ and _take)."""

    batch: TensorDict
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    # ---- torch.cat on DataProtos

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """`torch.cat(dataprotos)` (also torch.concat / torch.concatenate, dim 0) is `DataProto.concat`."""
        if func not in _CONCAT_FUNCTIONS:
            return NotImplemented  # torch then raises its usual "no implementation found" TypeError
        items, dim = _concat_arguments(args, kwargs or {})
        if dim != 0:
            raise ProtocolValueError(f"torch.cat on DataProtos concatenates rows (dim=0), got dim={dim!r}")
        kinds = sorted({type(item).__name__ for item in items if not isinstance(item, VerlMethods)})
        if kinds:
            raise ProtocolTypeError(
                f"torch.cat got DataProtos mixed with {kinds}; pass only DataProtos (or only tensors)"
            )
        return type(items[0]).concat(items)  # type: ignore[attr-defined]

    # ---- one TensorDict (verl's TensorDict-based workers)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict: batch tensors, non-tensor columns as NonTensorStack, meta_info as NonTensorData
        (see protocol/tensordict_convert.py). Tensors are shared, not copied."""
        return dataproto_to_tensordict(self.batch, self.non_tensor_batch, self.meta_info, len(self))  # type: ignore[arg-type]

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> Any:
        """Inverse of `to_tensordict`: tensors -> batch, NonTensorStack -> non_tensor_batch (object arrays),
        NonTensorData -> meta_info (added to a copy of `meta_info`)."""
        batch, non_tensor_batch, meta = tensordict_to_fields(tensor_dict, meta_info, num_batch_dims)
        return cls(batch, non_tensor_batch, meta)  # type: ignore[call-arg]

    # ---- selecting rows

    def select_idxs(self, idxs: Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor) -> Any:
        """Rows at integer positions or where a bool mask is True (copies); same as `data[idxs]`."""
        if isinstance(idxs, (int, np.integer, slice)):
            raise ProtocolTypeError(f"select_idxs takes a list, array or tensor of indices, got {type(idxs).__name__}")
        return self[idxs]  # type: ignore[index]

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> Any:
        """`data[start:end:step]` as a DataProto (views for positive steps)."""
        return self[slice(start, end, step)]  # type: ignore[index]

    def sample_level_repeat(self, repeat_times: RepeatCounts) -> Any:
        """Row i repeated repeat_times[i] times, rows kept in order (copies)."""
        counts = _repeat_counts(repeat_times, len(self))  # type: ignore[arg-type]
        return self._take(torch.arange(len(counts)).repeat_interleave(counts))  # type: ignore[attr-defined]

    # ---- reshaping columns into rows

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> Any:
        """Split each row's second dimension into `n_split` rows (for keys in `split_keys`).

        A key in `split_keys` of shape [B, C, ...] becomes [B * n_split, C // n_split, ...] (row b's column
        chunk j goes to row b * n_split + j); every other key is repeated n_split times per row so the rows
        stay aligned. `split_keys=None` splits no key (all are repeated); names in `split_keys` that are not
        keys of this DataProto are ignored, as verl does.
        """
        _require_positive_int("unfold_column_chunks: n_split", n_split)
        if isinstance(split_keys, str):
            raise ProtocolTypeError(
                f"unfold_column_chunks: split_keys must be a list of keys, got the string {split_keys!r}"
            )
        wanted = set(split_keys or ())

        def unfold(key: str, value: Any) -> Any:
            if key not in wanted:
                return (
                    value.repeat_interleave(n_split, dim=0)
                    if isinstance(value, torch.Tensor)
                    else np.repeat(value, n_split, axis=0)
                )
            if value.ndim < 2 or value.shape[1] % n_split:
                raise ProtocolValueError(
                    f"unfold_column_chunks: {key!r} has shape {list(value.shape)}; its second dimension must be "
                    f"divisible by n_split={n_split}"
                )
            shape = (value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])
            return value.reshape(shape).clone() if isinstance(value, torch.Tensor) else value.reshape(shape).copy()

        nested = [".".join(path) for path, _ in flatten_tensordict(self.batch)[0].nested]
        if nested:
            raise ProtocolValueError(
                f"unfold_column_chunks: nested batch keys {nested} are not supported; flatten them first"
            )
        batch = TensorDict(
            {k: unfold(k, v) for k, v in self.batch.items()}, batch_size=[len(self) * n_split], device=self.batch.device  # type: ignore[arg-type]
        )
        non_tensor = {k: unfold(k, v) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch, non_tensor, dict(self.meta_info))  # type: ignore[call-arg]

    # ---- padding

    def is_padding_enabled(self) -> bool:
        """True if this DataProto was built with auto_padding=True or `DataProtoConfig.auto_padding` is set."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Not provided: it would pad in place, and DataProto operations never change their input."""
        raise ProtocolTypeError(
            "DataProto.padding pads in place, which this DataProto never does: use "
            "`data, pad_size = data.pad_to_divisor(divisor)` (or pad_dataproto_to_divisor(data, divisor)) and "
            "`data.unpad(pad_size)`; worker-group dispatch pads and unpads by itself"
        )

    # ---- describing

    def print_size(self, prefix: str = "") -> None:
        """Print the GiB held by batch tensors and by numpy arrays."""
        tensor_bytes = sum(t.numel() * t.element_size() for _, t in flatten_tensordict(self.batch)[1])
        array_bytes = sum(a.nbytes for a in self.non_tensor_batch.values())
        message = (
            f"Size of tensordict: {tensor_bytes / 1024**3} GB, size of non_tensor_batch: {array_bytes / 1024**3} GB"
        )
        print(f"{prefix}, {message}" if prefix else message)

    def get_data_info(self) -> str:
        """One line per field: batch tensors (shape, dtype, device), numpy arrays, meta_info value types."""
        lines = ["batch"]
        for path, tensor in flatten_tensordict(self.batch)[1]:
            lines.append(f"  {'.'.join(path)}: {tuple(tensor.shape)} ({tensor.dtype}) {tensor.device}")
        lines.append("non_tensor_batch")
        lines.extend(f"  {k}: ndarray{v.shape} ({v.dtype})" for k, v in self.non_tensor_batch.items())
        lines.append("meta_info")
        lines.extend(f"  {k}: {type(v).__name__}" for k, v in self.meta_info.items())
        return "\n".join(lines)
