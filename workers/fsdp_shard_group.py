"""How many ranks one FSDP shard group spans: the one rule the workers (their device mesh, the LoRA base shared with a
tensor-parallel engine) and the memory plan (trainer/memory_plan) read `fsdp_config.fsdp_size` by."""

from __future__ import annotations


def shard_group_size(fsdp_size: int, ranks: int) -> int:
    """The ranks of one shard group out of `ranks`: `fsdp_size`, where -1 (or more than there are) means all of them."""
    return ranks if fsdp_size == -1 else min(fsdp_size, ranks)
