"""Training and inference workers run by the worker groups (FSDP2 backend in `workers.fsdp`)."""

from workers.config import actor_rollout_ref_config, critic_config, reward_model_config

__all__ = ["actor_rollout_ref_config", "critic_config", "reward_model_config"]
