"""`ActorSide`: what the actor worker asks of its training backend's side (FSDP2: workers/fsdp/actor_side.py;
megatron-core: workers/megatron/actor_side.py). The worker writes each method once (log-probs, the PPO, SFT and
DPO updates, checkpoints, generation's contract); a side builds the models, generates, and keeps its models'
state where each phase needs it (FSDP's offload and a LoRA actor's shared base; Megatron's state stays put)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from protocol import DataProto
from workers.rollout.in_process_sync import WeightSource
from workers.training.backend import TrainBackend
from workers.training.side import TrainedSide


class ActorSide(TrainedSide, Protocol):
    """The trained model is the actor; the residency hooks (`TrainedSide`) move its state."""

    actor: TrainBackend | None  # None for role "ref"
    ref: TrainBackend | None  # a separate frozen copy of the initial policy, when the role has one
    hybrid_rollout: Any  # a vLLM engine in this process (workers/rollout/hybrid.py), or None
    start_metrics: dict[str, float]  # what init measured (a shared base's savings)

    def reference(self, method: str) -> AbstractContextManager[TrainBackend]:
        """The model a reference forward runs on, resident for the block (LoRA: the actor, adapters off)."""
        ...

    def with_images(self, data: DataProto, method: str) -> DataProto:
        """`data` with its rows' processed images when it carries any; an error for a text-only model."""
        ...

    def after_update(self) -> None:
        """The step's update is done: drop what was kept for it (a vision model's processed images)."""
        ...

    def generate(self, prompts: DataProto, weights_version: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """This rank's share of `prompts` -> responses, and the step metrics the generation measured."""
        ...

    def weight_source(self) -> WeightSource:
        """The actor as the source of a weight send to engines in other processes (rollout.placement=separate)."""
        ...

    def sync_rollout_weights(self, weights_version: int) -> dict[str, float] | None:
        """Load the actor's current weights into the rollout now; None when nothing was to load here."""
        ...
