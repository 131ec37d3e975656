"""Stack dataset items into one DataProto batch."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto


def collate_to_dataproto(items: list[dict[str, Any]]) -> DataProto:
    """Tensors are stacked into `batch`; every other value goes into a 1-D object array."""
    if not items:
        raise ValueError("collate_to_dataproto needs at least one item")
    keys = list(items[0])
    for position, item in enumerate(items[1:], start=1):
        if set(item) != set(keys):
            raise KeyError(f"item {position} has keys {sorted(item)} but item 0 has {sorted(keys)}")
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, list[Any]] = {}
    for key in keys:
        values = [item[key] for item in items]
        is_tensor = [isinstance(v, torch.Tensor) for v in values]
        if all(is_tensor):
            tensors[key] = torch.stack(values)
        elif any(is_tensor):
            raise TypeError(f"key {key!r} mixes tensors and other values across items")
        else:
            non_tensors[key] = values  # from_dict builds 1-D object arrays, never 2-D ones
    return DataProto.from_dict(tensors, non_tensors)
