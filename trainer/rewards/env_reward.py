"""Scores from the multi-turn rollout's environments, with the rule reward for rows that have none."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from workers.rl_math.masked import last_valid_positions


class EnvRewardManager:
    """Rows whose environment returned a reward (`env_reward` finite) get it on their last model token;
    the others are scored by `fallback` (the rule reward manager). Same return as `RuleRewardManager`."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.tokenizer = fallback.tokenizer

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        if "env_reward" not in data.batch.keys():
            return self.fallback(data)
        env_reward = data.batch["env_reward"].float()
        has_reward = torch.isfinite(env_reward)
        mask = data.batch["response_mask"]
        if has_reward.all():
            scores, metrics = torch.zeros(mask.shape, dtype=torch.float32), {}
        else:
            scores, metrics = self.fallback(data[~has_reward.numpy()]) if has_reward.any() else self.fallback(data)
            full = torch.zeros(mask.shape, dtype=torch.float32)
            full[~has_reward] = scores
            scores = full
        last = last_valid_positions(mask)
        rows = torch.nonzero(has_reward & (last >= 0)).squeeze(-1)
        scores[rows, last[rows]] = env_reward[rows]
        if has_reward.any():
            metrics["env/mean"] = float(env_reward[has_reward].mean())
        return scores, metrics
