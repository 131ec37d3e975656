"""Trainer ranks sharing one hybrid vLLM engine (rollout.placement=hybrid, rollout.tensor_model_parallel_size=k > 1,
verl's usual layout for large models): k consecutive ranks form a group, in one of two layouts.

- Per rank (rollout.engine_process false, the default): every rank holds one tensor-parallel shard of the engine
  in its own process (vLLM's external launcher over the trainer's process group). Each rank loads its shard of
  every weight sync; at generate the group's prompts are gathered on every rank, each runs the same engine call
  (the shards compute it together) and keeps its own rows.
- In processes of its own (rollout.engine_process true): the group's first rank (the leader) runs an engine
  spanning the group's k devices in vLLM's worker processes, and the others run none. Every rank still takes part
  in each weight sync (the FSDP or Megatron gathers are collectives), the leader loading what they produce; at
  generate the group's prompts go to the leader and each rank gets its own rows back.

The group talks over a gloo process group of its own (Python objects: prompts, results, small decisions).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class EngineGroup:
    size: int  # rollout.tensor_model_parallel_size
    ranks: tuple[int, ...]  # the trainer ranks sharing the engine; the first is the leader
    rank: int  # this process's trainer rank
    process_group: Any  # gloo, over `ranks`
    per_rank: bool = False  # every rank holds a shard of the engine (else the leader holds all of it)

    @property
    def leader(self) -> int:
        return self.ranks[0]

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @property
    def holds_engine(self) -> bool:
        """Whether this rank builds an engine (its shard, or the whole engine as the leader)."""
        return self.per_rank or self.is_leader

    def all_gather(self, item: Any) -> list[Any]:
        """Every rank's `item`, in rank order, on every rank."""
        items: list[Any] = [None] * self.size
        dist.all_gather_object(items, item, group=self.process_group)
        return items

    def gather(self, item: Any) -> list[Any] | None:
        """Every rank's `item`, in rank order, on the leader (None elsewhere)."""
        items = [None] * self.size if self.is_leader else None
        dist.gather_object(item, items, dst=self.leader, group=self.process_group)
        return items

    def scatter(self, items: list[Any] | None) -> Any:
        """The leader's `items[i]` to the group's i-th rank; each rank returns its own."""
        received = [None]
        dist.scatter_object_list(received, items if self.is_leader else None, src=self.leader, group=self.process_group)
        return received[0]

    def from_leader(self, value: Any) -> Any:
        """The leader's `value` on every rank of the group."""
        box = [value if self.is_leader else None]
        dist.broadcast_object_list(box, src=self.leader, group=self.process_group)
        return box[0]


def sleep_engine(engine: Any | None, group: EngineGroup | None) -> None:
    """Put a hybrid engine to sleep (`engine`: None on the ranks of a group that hold none). In a group every rank
    returns only once the leader's engine has released its memory on all the group's GPUs: the engine's workers on
    the other ranks' GPUs take seconds to move a large model's weights to the host, and a rank that went on at once
    would bring its own weights back beside them (with that race open, the 30B-A3B run's reference pass measured
    14.7 GiB over the plan). A rank holding its own shard frees its own GPU's memory: no wait."""
    if engine is not None:
        engine.sleep()
    if group is not None and not group.per_rank:
        group.from_leader(None)


def engine_group(size: int, device: torch.device, per_rank: bool = False) -> EngineGroup | None:
    """This rank's group for a hybrid engine of tensor-parallel `size` (None for size 1: each rank its own engine);
    `per_rank`: each rank holds a shard of it. A collective: every trainer rank creates every group, in the same
    order."""
    if size == 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(
            f"rollout.tensor_model_parallel_size={size} must divide the {world} trainer ranks sharing hybrid engines"
        )
    mine = None
    for first in range(0, world, size):
        ranks = tuple(range(first, first + size))
        group = dist.new_group(list(ranks), backend="gloo")
        if rank in ranks:
            mine = EngineGroup(size, ranks, rank, group, per_rank)
    return mine


def group_devices(group: EngineGroup, device: torch.device) -> str | None:
    """The group's GPUs in CUDA_VISIBLE_DEVICES form, the leader's first (None on CPU). Each trainer process sees
    its one GPU (Ray sets CUDA_VISIBLE_DEVICES per process); the leader's engine spans all of them. None as well
    for a group of per-rank shards: each uses its own process's GPU."""
    if group.per_rank:
        return None
    own = os.environ.get("CUDA_VISIBLE_DEVICES", "") if device.type == "cuda" else ""
    every = group.gather(own)
    if device.type != "cuda" or not group.is_leader:
        return None
    if any(not entry or "," in entry for entry in every):
        raise RuntimeError(
            f"a hybrid engine over GPUs {every}: each trainer rank must see exactly one GPU (Ray's per-process "
            "CUDA_VISIBLE_DEVICES) to know which GPUs the group's engine spans"
        )
    return ",".join(every)
