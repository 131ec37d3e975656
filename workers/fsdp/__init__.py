"""FSDP2 workers: actor / rollout / reference policy, critic and reward model on torch.distributed."""

from workers.fsdp.actor_rollout_ref import ActorRolloutRefWorker
from workers.fsdp.critic import CriticWorker
from workers.fsdp.engine import FSDPEngine
from workers.fsdp.reward_model import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "FSDPEngine", "RewardModelWorker"]
