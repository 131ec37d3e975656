"""FSDP2 workers: actor / rollout / reference policy, critic and reward model on torch.distributed. The actor and
critic workers serve every backend (workers/actor/, workers/critic/); they are exported here too, where verl's
users look for them."""

from workers.actor.worker import ActorRolloutRefWorker
from workers.critic.worker import CriticWorker
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.reward_model import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "FSDPBackend", "RewardModelWorker"]
