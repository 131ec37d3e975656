"""FSDP2 workers: actor / rollout / reference policy, critic and reward model on torch.distributed. The actor
worker serves every backend (workers/actor/); it is exported here too, where verl's users look for it."""

from workers.actor.worker import ActorRolloutRefWorker
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.critic import CriticWorker
from workers.fsdp.reward_model import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "FSDPBackend", "RewardModelWorker"]
