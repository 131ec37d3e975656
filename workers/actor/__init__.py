"""The actor / rollout / reference worker, one class for every training backend (`actor.strategy`)."""

from workers.actor.worker import ROLES, ActorRolloutRefWorker

__all__ = ["ROLES", "ActorRolloutRefWorker"]
