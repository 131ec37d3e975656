"""Arguments of one call that go to several ranks: a large value sent to several ranks is stored once, a
large chunk sent to one rank is marked for reading in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import torch

from single_controller.shards import ExclusiveChunk, PaddedShard

# A DataProto chunk at least this large that goes to a single rank is read in place by that rank.
EXCLUSIVE_CHUNK_MIN_BYTES = 1 << 20


def _dataproto_bytes(value: Any) -> int:
    from protocol import DataProto

    data = value.data if isinstance(value, PaddedShard) else value
    return data.nbytes if isinstance(data, DataProto) else 0


class SharedObjects:
    """Stores a large value sent to several ranks once, and marks large single-rank chunks exclusive."""

    def __init__(self) -> None:
        self._refs: dict[int, ray.ObjectRef] = {}

    def place(self, value: Any, all_ranks: list[Any]) -> Any:
        from protocol import DataProto

        if not isinstance(value, (DataProto, PaddedShard, torch.Tensor, np.ndarray)):
            return value
        if sum(1 for v in all_ranks if v is value) < 2:
            if _dataproto_bytes(value) >= EXCLUSIVE_CHUNK_MIN_BYTES:
                return ExclusiveChunk(ray.put(value))
            return value
        key = id(value)
        if key not in self._refs:
            self._refs[key] = ray.put(value)
        return self._refs[key]
