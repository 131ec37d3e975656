"""The actor's loss on one micro-batch: clipped policy surrogate (PPO's token ratio, or GSPO's sequence ratio:
`policy_loss.loss_mode`), entropy bonus and KL-to-reference loss."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from protocol import DataProto
from workers.fsdp.sequences import response_log_probs_and_entropy, response_mask
from workers.rl_math.kl import kl_penalty
from workers.rl_math.losses import agg_loss, compute_policy_loss
from workers.rl_math.rollout_correction import ROLLOUT_IS_WEIGHTS


def required_update_keys(actor_cfg: dict[str, Any]) -> list[str]:
    keys = ["input_ids", "attention_mask", "position_ids", "responses", "old_log_probs", "advantages"]
    return keys + (["ref_log_prob"] if actor_cfg["use_kl_loss"] else [])


def actor_micro_loss(
    model: nn.Module, micro: DataProto, device: torch.device, temperature: float, actor_cfg: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss = pg_loss - entropy_coeff * entropy (+ kl_loss_coef * kl_loss), each aggregated with
    `loss_agg_mode` over this micro-batch's response tokens."""
    # Without an entropy bonus the entropy is only reported: no graph is kept for it.
    entropy_grad = actor_cfg["entropy_coeff"] != 0
    log_probs, entropy = response_log_probs_and_entropy(model, micro, device, temperature, True, entropy_grad)
    return actor_loss_from_log_probs(log_probs, entropy, micro, device, actor_cfg)


def actor_loss_from_log_probs(
    log_probs: torch.Tensor, entropy: torch.Tensor, micro: DataProto, device: torch.device, actor_cfg: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The same loss from the response tokens' log-probs and entropies [b, R] (any backend computes those)."""
    mode = actor_cfg["loss_agg_mode"]
    mask = response_mask(micro).to(device)
    entropy_coeff = actor_cfg["entropy_coeff"]
    entropy_loss = agg_loss(entropy, mask, mode)
    # Truncated importance-sampling weights, when the driver computed them (rollout.tis_imp_ratio_cap).
    is_weights = micro.batch[ROLLOUT_IS_WEIGHTS].to(device) if ROLLOUT_IS_WEIGHTS in micro.batch.keys() else None

    policy = compute_policy_loss(
        old_log_prob=micro.batch["old_log_probs"].to(device),
        log_prob=log_probs,
        advantages=micro.batch["advantages"].to(device),
        response_mask=mask,
        clip_ratio_low=actor_cfg["clip_ratio_low"],
        clip_ratio_high=actor_cfg["clip_ratio_high"],
        clip_ratio_c=actor_cfg["clip_ratio_c"],
        loss_agg_mode=mode,
        token_weights=is_weights,
        loss_mode=actor_cfg["policy_loss"]["loss_mode"],
    )
    loss = policy["pg_loss"] - entropy_coeff * entropy_loss
    metrics = {name: float(value.detach()) for name, value in policy.items()}
    metrics["entropy"] = float(entropy_loss.detach())
    if actor_cfg["use_kl_loss"]:
        kl = kl_penalty(log_probs, micro.batch["ref_log_prob"].to(device), actor_cfg["kl_loss_type"])
        kl_loss = agg_loss(kl, mask, mode)
        loss = loss + actor_cfg["kl_loss_coef"] * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())
        metrics["kl_coef"] = actor_cfg["kl_loss_coef"]
    return loss, metrics
