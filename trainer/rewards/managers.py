"""The reward manager a run scores with (`reward_model.reward_manager`), built by the name registered in
trainer/reward_settings.py (REWARD_MANAGERS)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from protocol import DataProto
from trainer.reward_settings import overlong_buffer

from .dapo import DAPORewardManager
from .loader import load_reward_function
from .manager import RuleRewardManager

# name -> (the base manager, the run config) -> the manager; the names of REWARD_MANAGERS (a test checks).
BUILDERS: dict[str, Callable[[Any, DictConfig], Any]] = {
    "naive": lambda base, cfg: base,
    "dapo": lambda base, cfg: DAPORewardManager(base, overlong_buffer(cfg)),
}


def build_reward_manager(cfg: DictConfig, tokenizer: Any) -> Any:
    """The configured manager: the rule scorers (custom_reward_function, or the built-in ones), behind the
    environments' own rewards in a multi-turn run, wrapped as `reward_model.reward_manager` names."""
    function = cfg.custom_reward_function
    base: Any = RuleRewardManager(tokenizer, compute_score=load_reward_function(function.path, function.name))
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        from .env_reward import EnvRewardManager

        base = EnvRewardManager(base)  # environments may score their own episodes
    return BUILDERS[str(cfg.reward_model.get("reward_manager", "naive"))](base, cfg)


def task_scores(reward_fn: Any, data: DataProto) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """([B, R] token scores, [B] task scores, metrics) of `reward_fn` on `data`. The task score is what the
    scorer gave, before a manager's shaping (the dapo manager's overlong penalty); for a manager without
    shaping it is the summed token scores."""
    score = getattr(reward_fn, "score", None)
    if score is not None:
        return score(data)
    scores, metrics = reward_fn(data)
    return scores, scores.sum(-1), metrics
