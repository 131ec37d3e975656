"""Ulysses sequence parallelism in an FSDP worker group: the (dp, sp) layout and the dispatch over it.

With `ulysses_sequence_parallel_size` k the group's W ranks form W/k data-parallel groups of k consecutive
ranks. FSDP still shards the model over all W ranks; the k ranks of a data-parallel group receive the same
rows (the mesh dispatch splits the batch over the W/k groups only and collects each group's output from its
first rank) and split each packed micro-batch's tokens between them (`workers/packing/ulysses.py`).
Generation does not use it: `generate_sequences` keeps splitting prompts over all W ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.packing.ulysses import SequenceParallel, sequence_parallel_group
from workers.training.mesh import TRAIN_MESH


@dataclass(frozen=True)
class SequenceLayout:
    """This worker's place in the (dp, sp) layout."""

    size: int  # k: ranks sharing one sequence
    dp_size: int  # W / k data-parallel groups
    group: SequenceParallel | None  # None for k = 1
    setting: str  # the config key of k, for messages

    def token_budget(self, per_gpu: int) -> int:
        """A micro-batch's token budget: `*_max_token_len_per_gpu` tokens on each of the k ranks."""
        return per_gpu * self.size

    def where(self, role: str) -> str:
        """How a batch-size error names the ranks a global mini-batch is split over."""
        if self.size == 1:
            return role
        return f"{role} (over {self.dp_size} data-parallel groups of {self.setting}={self.size} ranks)"


def init_sequence_layout(worker: Any, size: int, setting: str) -> SequenceLayout:
    """Declare the worker's (dp, sp) mesh for the dispatch and build its sequence-parallel group (collective:
    every rank calls it, after the default process group exists)."""
    if worker.world_size % size:
        raise ValueError(
            f"{setting}={size} must divide the worker group's {worker.world_size} ranks (each data-parallel group "
            f"is {size} ranks sharing its sequences)"
        )
    placement = worker.declare_mesh(TRAIN_MESH, {"dp": worker.world_size // size, "sp": size})
    return SequenceLayout(size, placement.dp_size, sequence_parallel_group(size), setting)
