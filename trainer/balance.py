"""Reorder a rollout batch so the worker groups' even row split gives every rank about the same tokens."""

from __future__ import annotations

import torch

from protocol import DataProto
from workers.packing.token_budget import equal_size_shards


def balance_batch(batch: DataProto, ranks: int) -> DataProto:
    """Rows regrouped into `ranks` consecutive shards of equal row count and balanced token sums (rows stay
    whole; everything keyed by row, like GRPO's uid groups, is unaffected). Unchanged when the rows do not
    split evenly over the ranks."""
    if ranks <= 1 or len(batch) % ranks:
        return batch
    lengths = batch.batch["attention_mask"].sum(dim=1).tolist()
    order = [row for shard in equal_size_shards(lengths, ranks) for row in shard]
    return batch[torch.tensor(order)]
