"""Assertions for tests that handle DataProtos (like torch.testing, for this container)."""

from __future__ import annotations

import numpy as np
import torch

from protocol._tensordict_utils import flatten_tensordict
from protocol.arrays import arrays_equal, tensors_equal, values_equal
from protocol.data_proto import DataProto


def assert_dataproto_equal(actual: DataProto, expected: DataProto, check_meta_info: bool = True) -> None:
    """Same length, keys, nested layout, dtypes, shapes and values (NaN == NaN)."""
    assert len(actual) == len(expected), f"length {len(actual)} != {len(expected)}"
    actual_layout, actual_leaves = flatten_tensordict(actual.batch)
    expected_layout, expected_leaves = flatten_tensordict(expected.batch)
    assert actual_layout == expected_layout, f"batch layout {actual_layout} != {expected_layout}"
    actual_map, expected_map = dict(actual_leaves), dict(expected_leaves)
    assert sorted(actual_map) == sorted(expected_map), f"batch keys {sorted(actual_map)} != {sorted(expected_map)}"
    for key, tensor in expected_map.items():
        got = actual_map[key]
        assert got.dtype == tensor.dtype, f"batch[{key}] dtype {got.dtype} != {tensor.dtype}"
        assert got.shape == tensor.shape, f"batch[{key}] shape {tuple(got.shape)} != {tuple(tensor.shape)}"
        assert tensors_equal(got.cpu(), tensor.cpu()), f"batch[{key}] values differ"
    assert sorted(actual.non_tensor_batch) == sorted(expected.non_tensor_batch), (
        f"non_tensor_batch keys {sorted(actual.non_tensor_batch)} != {sorted(expected.non_tensor_batch)}"
    )
    for key, array in expected.non_tensor_batch.items():
        assert arrays_equal(actual.non_tensor_batch[key], array), f"non_tensor_batch[{key!r}] differs"
    if check_meta_info:
        assert values_equal(actual.meta_info, expected.meta_info), (
            f"meta_info {actual.meta_info} != {expected.meta_info}"
        )


def shares_memory(a: DataProto, b: DataProto) -> bool:
    """True if any tensor or array of `a` overlaps memory of any tensor or array of `b`."""
    a_tensors = [t for _, t in flatten_tensordict(a.batch)[1] if t.numel()]
    b_tensors = [t for _, t in flatten_tensordict(b.batch)[1] if t.numel()]
    if any(x.device == y.device and _ranges_overlap(x, y) for x in a_tensors for y in b_tensors):
        return True
    return any(np.shares_memory(x, y) for x in a.non_tensor_batch.values() for y in b.non_tensor_batch.values())


def _ranges_overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    x_start, y_start = x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()
    x_end = x_start + x.untyped_storage().nbytes()
    y_end = y_start + y.untyped_storage().nbytes()
    return x_start < y_end and y_start < x_end
