"""DataProto operations that split a batch into parts, join parts into a batch, or rearrange its rows.

They live in a mixin below `data_proto.py` so the core file keeps the container itself (construction,
indexing, keys, transport). Splitting: `chunk`, `split`, `make_iterator`; joining: `concat`; rearranging:
`repeat`, `reorder`; evening out lengths for workers: `pad_to_divisor`, `unpad`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch
from tensordict import TensorDictBase

from protocol._indexing import normalize_index
from protocol._keys import format_key
from protocol._row_checks import _check_concat_leaves, _require_positive_int
from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.meta_merge import merge_meta_info


class RowOperations:
    """Mixed into DataProto, which provides the fields and the methods declared below.

    Results are built with `cls` / `type(self)` (or come from `self[...]` and `_take`), so this module never
    imports `data_proto.py`, which imports it.
    """

    batch: TensorDictBase
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    if TYPE_CHECKING:  # defined on DataProto / VerlMethods; stubs here would shadow them at run time

        def __init__(
            self, batch: TensorDictBase, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any]
        ) -> None: ...
        def __len__(self) -> int: ...
        def __getitem__(self, index: Any) -> Any: ...
        def _take(self, positions: torch.Tensor) -> Self: ...
        def _batch_keys(self) -> list[Any]: ...
        def is_padding_enabled(self) -> bool: ...

    # ------------------------------------------------------------------ joining

    @classmethod
    def concat(cls, items: Sequence[Self]) -> Self:
        """Concatenate along the batch dimension (copies).

        meta_info is merged (see protocol/meta_merge.py): `metrics` dicts become per-key lists in item
        order; per-batch keys (the sampling `seed`, the rollout weights version) are combined by their rule
        (first seed, oldest version); any other key must have equal values in the items that hold it.
        """
        items = list(items)
        if not items:
            raise ProtocolValueError("concat needs at least one DataProto")
        for i, item in enumerate(items):
            if not isinstance(item, cls):
                raise ProtocolTypeError(f"concat: item {i} is {type(item).__name__}, not a DataProto")
        first_batch = sorted(map(format_key, items[0]._batch_keys()))
        first_non_tensor = sorted(items[0].non_tensor_batch)
        for i, item in enumerate(items[1:], start=1):
            batch_keys = sorted(map(format_key, item._batch_keys()))
            if batch_keys != first_batch:
                raise ProtocolValueError(f"concat: item 0 has batch keys {first_batch} but item {i} has {batch_keys}")
            non_tensor_keys = sorted(item.non_tensor_batch)
            if non_tensor_keys != first_non_tensor:
                raise ProtocolValueError(
                    f"concat: item 0 has non_tensor_batch keys {first_non_tensor} but item {i} has {non_tensor_keys}"
                )
        _check_concat_leaves([item.batch for item in items])
        batch = torch.cat([item.batch for item in items], dim=0)
        non_tensor = {
            k: np.concatenate([item.non_tensor_batch[k] for item in items]) for k in items[0].non_tensor_batch
        }
        return cls(batch, non_tensor, merge_meta_info([item.meta_info for item in items]))

    # ------------------------------------------------------------------ splitting

    def chunk(self, chunks: int) -> list[Self]:
        """Split into `chunks` equal parts (views). len(self) must be divisible by chunks, unless
        padding is enabled (`is_padding_enabled()`): then the first len % chunks parts get one more row."""
        _require_positive_int("chunks", chunks)
        length = len(self)
        if length % chunks and self.is_padding_enabled():
            bounds = np.cumsum([0] + [length // chunks + (i < length % chunks) for i in range(chunks)])
            return [self[int(a) : int(b)] for a, b in zip(bounds[:-1], bounds[1:])]
        if length % chunks:
            raise ProtocolValueError(
                f"cannot chunk a DataProto of length {length} into {chunks} equal chunks; pad it first with "
                f"data.pad_to_divisor({chunks}) / pad_dataproto_to_divisor(data, {chunks}), or use split() "
                "for uneven pieces"
            )
        size = length // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def split(self, split_size: int) -> list[Self]:
        """Consecutive parts of split_size samples (views); the last may be smaller; [] if empty."""
        _require_positive_int("split_size", split_size)
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
        shuffle: bool = True,
    ) -> Iterator[Self]:
        """Yield mini-batches (copies) of mini_batch_size, covering every sample once per epoch.

        With shuffle, epoch e uses a permutation from torch.Generator seeded with seed + e
        (a random seed when seed is None). len(self) must be divisible by mini_batch_size.
        `dataloader_kwargs` may only hold {"shuffle": bool}; when given it decides shuffling, with
        torch DataLoader's default (no shuffle) when the key is absent.
        """
        if dataloader_kwargs is not None:
            unknown = sorted(set(dataloader_kwargs) - {"shuffle"})
            if unknown:
                raise ProtocolValueError(
                    f"make_iterator: dataloader_kwargs {unknown} are not supported; only 'shuffle' is"
                )
            shuffle = bool(dataloader_kwargs.get("shuffle", False))
        _require_positive_int("mini_batch_size", mini_batch_size)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ProtocolValueError(f"epochs must be a non-negative int, got {epochs!r}")
        length = len(self)
        if length % mini_batch_size:
            raise ProtocolValueError(
                f"make_iterator: length {length} is not divisible by mini_batch_size {mini_batch_size}; "
                "pad first (pad_to_divisor) or pick another mini_batch_size"
            )
        base_seed = seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item())

        def generate() -> Iterator[Self]:
            for epoch in range(epochs):
                if shuffle:
                    generator = torch.Generator().manual_seed(base_seed + epoch)
                    order = torch.randperm(length, generator=generator)
                else:
                    order = torch.arange(length)
                for start in range(0, length, mini_batch_size):
                    yield self._take(order[start : start + mini_batch_size])

        return generate()

    # ------------------------------------------------------------------ rearranging

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> Self:
        """Each sample repeat_times times: [a, a, b, b] if interleave else [a, b, a, b] (copies)."""
        if isinstance(repeat_times, bool) or not isinstance(repeat_times, int) or repeat_times < 0:
            raise ProtocolValueError(f"repeat_times must be a non-negative int, got {repeat_times!r}")
        positions = torch.arange(len(self))
        positions = positions.repeat_interleave(repeat_times) if interleave else positions.repeat(repeat_times)
        return self._take(positions)

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """MUTATES self, like verl: its rows become the rows at `indices` (any index list, array, tensor or
        bool mask; repeats and subsets allowed, as `batch[indices]` allows). Returns self as well, so
        `data = data.reorder(idx)` also works. Tensors are copied into new containers: other DataProtos that
        shared this one's tensors keep their rows."""
        if isinstance(indices, (int, np.integer, slice)) or (isinstance(indices, torch.Tensor) and indices.ndim == 0):
            raise ProtocolTypeError(f"reorder needs a sequence of row indices, got {type(indices).__name__}")
        positions = normalize_index(indices, len(self))
        assert isinstance(positions, torch.Tensor)
        reordered = self._take(positions)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    # ------------------------------------------------------------------ padding

    def pad_to_divisor(self, size_divisor: int) -> tuple[Self, int]:
        """Return (a new DataProto whose length is a multiple of size_divisor, pad_size).

        Padding rows repeat rows from the start (cyclically when the pad is longer than the
        data), so they are real samples any worker can process. The result never shares
        memory with `self`, even when no padding is needed.
        """
        _require_positive_int("size_divisor", size_divisor)
        length = len(self)
        if length == 0:
            raise ProtocolValueError("cannot pad an empty DataProto: there are no rows to repeat")
        pad_size = (-length) % size_divisor
        positions = torch.cat([torch.arange(length), torch.arange(pad_size) % length])
        return self[positions], pad_size

    def unpad(self, pad_size: int) -> Self:
        """Drop the last pad_size rows; returns a new DataProto that does not share memory with `self`."""
        if isinstance(pad_size, bool) or not isinstance(pad_size, int) or not 0 <= pad_size <= len(self):
            raise ProtocolValueError(f"pad_size must be an int in [0, {len(self)}], got {pad_size!r}")
        return self[torch.arange(len(self) - pad_size)]


__all__ = ["RowOperations"]
