"""The batch's routing table ([b, S, layers, k], one entry per padded position) in the order a forward hands
tokens to the routers, and back.

A padded forward routes every position of every row, row by row; a packed one only the real tokens
(`attention_mask`), row by row; under Ulysses each rank of the group routes its contiguous shard of the packed row
(padded to a multiple of the group size: workers/packing/ulysses.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from protocol import DataProto
from workers.packing.forward import is_packed, sequence_parallel_of
from workers.packing.ulysses import SequenceParallel, gather_shards
from workers.routing_replay.hooks import NOT_RECORDED

ROUTED_EXPERTS = "routed_experts"  # batch key: int16 [B, S, layers, k], `NOT_RECORDED` where the live router picks


def without_routing_table(batch: DataProto) -> DataProto:
    """`batch` without its routing table, for the roles that route live (reference, critic, reward model): the
    table is the batch's largest tensor on a mixture of experts (~0.3 GB a step at 30B-A3B's shape), so it is
    not sent where nothing reads it. The other tensors are shared, not copied; `batch` is left as it was."""
    if ROUTED_EXPERTS not in batch.batch.keys():
        return batch
    return batch.select(batch_keys=[key for key in batch.batch.keys() if key != ROUTED_EXPERTS])


@dataclass(frozen=True)
class TokenOrder:
    """How one micro-batch's positions reach the routers of `model`."""

    valid: torch.Tensor  # [b, S] bool: the real tokens
    packed: bool
    sequence_parallel: SequenceParallel | None

    @classmethod
    def of(cls, model: nn.Module, attention_mask: torch.Tensor) -> "TokenOrder":
        packed = is_packed(model)
        return cls(attention_mask.bool(), packed, sequence_parallel_of(model) if packed else None)

    def to_forward(self, table: torch.Tensor) -> torch.Tensor:
        """[b, S, layers, k] -> [tokens this rank routes, layers, k] (long)."""
        table = table.long()
        if not self.packed:
            return table.flatten(0, 1)
        packed = table[self.valid.to(table.device)]
        sp = self.sequence_parallel
        if sp is None:
            return packed
        width = math.ceil(packed.shape[0] / sp.size)
        padded = packed.new_full((width * sp.size, *packed.shape[1:]), NOT_RECORDED)
        padded[: packed.shape[0]] = packed
        return padded[sp.rank * width : (sp.rank + 1) * width]

    def to_positions(self, routed: torch.Tensor) -> torch.Tensor:
        """`to_forward`'s inverse for what this rank's routers chose: [b, S, layers, k] int16, `NOT_RECORDED` at
        padding (collective under Ulysses: the group's shards are gathered)."""
        valid = self.valid.to(routed.device)
        if not self.packed:
            table = routed.view(*valid.shape, *routed.shape[1:]).clone()
            table[~valid] = NOT_RECORDED
            return table.to(torch.int16)
        tokens = int(valid.sum())
        sp = self.sequence_parallel
        if sp is not None:
            routed = gather_shards(routed, sp, [routed.shape[0]] * sp.size)[:tokens]
        table = routed.new_full((*valid.shape, *routed.shape[1:]), NOT_RECORDED)
        table[valid] = routed
        return table.to(torch.int16)
