"""The critic worker, one class for every training backend (`critic.strategy`)."""

from workers.critic.worker import CriticWorker

__all__ = ["CriticWorker"]
