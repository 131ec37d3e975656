"""Turn a scored rollout batch into advantages and returns with the configured estimator."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from protocol import DataProto
from trainer.algorithms import apply_kl_penalty, get_advantage_estimator


def token_level_rewards(batch: DataProto, algo: DictConfig, kl_ctrl: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores, minus the KL penalty against the reference when it goes into the reward."""
    scores = batch.batch["token_level_scores"]
    if not algo.use_kl_in_reward:
        return scores, {}
    return apply_kl_penalty(
        scores,
        batch.batch["old_log_probs"],
        batch.batch["ref_log_prob"],
        batch.batch["response_mask"],
        kl_ctrl,
        algo.kl_penalty,
    )


def compute_advantage(batch: DataProto, algo: DictConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [B, R], for `algo.adv_estimator`."""
    name = algo.adv_estimator
    estimator = get_advantage_estimator(name)
    rewards, mask = batch.batch["token_level_rewards"], batch.batch["response_mask"]
    if name == "gae":
        return estimator(rewards, batch.batch["values"], mask, gamma=algo.gamma, lam=algo.lam)
    if name == "grpo":
        return estimator(rewards, mask, batch.non_tensor_batch["uid"], norm_adv_by_std=algo.norm_adv_by_std_in_grpo)
    if name in ("rloo", "reinforce_plus_plus_baseline"):
        return estimator(rewards, mask, batch.non_tensor_batch["uid"])
    if name == "reinforce_plus_plus":
        return estimator(rewards, mask, gamma=algo.gamma)
    if name == "remax":
        return estimator(rewards, batch.batch["reward_baselines"], mask)
    raise ValueError(f"unknown adv_estimator {name!r}")
