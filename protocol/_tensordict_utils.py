"""Flatten a TensorDict into leaf tensors plus layout, and build it back.

Transport and disk formats store flat (key path -> tensor) maps; the layout keeps what a
flat map loses: the batch size of each nested TensorDict (it may have extra batch dims)
and nested TensorDicts that have no leaves at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class TensorDictLayout:
    batch_size: list[int]
    # Nested TensorDicts, parents before children, with their own batch sizes.
    nested: list[tuple[KeyPath, list[int]]]


def key_path(key: str | tuple[str, ...]) -> KeyPath:
    return (key,) if isinstance(key, str) else tuple(key)


def td_key(path: KeyPath) -> str | KeyPath:
    """TensorDict spells top-level keys as str and nested ones as tuples."""
    return path[0] if len(path) == 1 else path


def flatten_tensordict(td: TensorDictBase) -> tuple[TensorDictLayout, list[tuple[KeyPath, torch.Tensor]]]:
    """Return the layout and (key path, tensor) leaves; non-tensor leaves are rejected."""
    nested: list[tuple[KeyPath, list[int]]] = []
    leaves: list[tuple[KeyPath, torch.Tensor]] = []
    for key, value in td.items(include_nested=True):
        path = key_path(key)
        if isinstance(value, TensorDictBase):
            nested.append((path, list(value.batch_size)))
        elif isinstance(value, torch.Tensor):
            leaves.append((path, value))
        else:
            raise TypeError(
                f"batch[{'.'.join(path)!r}] holds {type(value).__name__}; only tensors (and nested "
                "TensorDicts) can be transported or saved, put other data in non_tensor_batch"
            )
    nested.sort(key=lambda item: len(item[0]))
    return TensorDictLayout(list(td.batch_size), nested), leaves


def build_tensordict(
    layout: TensorDictLayout,
    leaves: list[tuple[KeyPath, torch.Tensor]],
    device: torch.device | None = None,
) -> TensorDict:
    """Inverse of flatten_tensordict; keys come back in leaf order."""
    nested_sizes = dict(layout.nested)
    td = TensorDict({}, batch_size=layout.batch_size, device=device)

    def ensure_nested(path: KeyPath) -> None:
        # Create parents on first use so key order follows the leaves.
        for depth in range(1, len(path) + 1):
            prefix = path[:depth]
            if td_key(prefix) not in td.keys(include_nested=True):
                size = nested_sizes.get(prefix, layout.batch_size)
                td.set(td_key(prefix), TensorDict({}, batch_size=size, device=device))

    for path, tensor in leaves:
        ensure_nested(path[:-1])
        td.set(td_key(path), tensor)
    for path, _ in layout.nested:  # nested TensorDicts without leaves
        ensure_nested(path)
    return td
