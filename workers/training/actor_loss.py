"""The actor's loss on one micro-batch: clipped policy surrogate (PPO's token ratio, or GSPO's sequence ratio:
`policy_loss.loss_mode`), entropy bonus and KL-to-reference loss."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from workers.rl_math.kl import kl_penalty
from workers.rl_math.losses import agg_loss, compute_policy_loss
from workers.rl_math.rollout_correction import (
    OLD_LOG_PROBS,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
    logprob_gap_metrics,
    truncated_is_weights,
)
from workers.training.backend import ResponseForward, ResponseOutputs
from workers.training.batch_keys import response_mask


def required_update_keys(actor_cfg: dict[str, Any], with_old_log_probs: bool = True) -> list[str]:
    keys = ["input_ids", "attention_mask", "position_ids", "responses", "advantages"]
    keys += [OLD_LOG_PROBS] if with_old_log_probs else []
    return keys + (["ref_log_prob"] if actor_cfg["use_kl_loss"] else [])


def actor_forward(actor_cfg: dict[str, Any], temperature: float) -> ResponseForward:
    """The actor update's forward: log-probs and entropies; without an entropy bonus the entropy is only
    reported, so no graph is kept for it."""
    return ResponseForward("log_probs", temperature, with_entropy=True, entropy_grad=actor_cfg["entropy_coeff"] != 0)


def actor_loss(
    outputs: ResponseOutputs, micro: DataProto, actor_cfg: dict[str, Any], is_cap: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's loss on one micro-batch from `actor_forward`'s outputs (any backend)."""
    loss, metrics = actor_loss_from_log_probs(
        outputs.log_probs, outputs.entropy, micro, outputs.device, actor_cfg, is_cap
    )
    if outputs.router_loss is not None:  # actor.router_aux_loss_coef on a mixture of experts
        loss = loss + actor_cfg["router_aux_loss_coef"] * outputs.router_loss
        metrics["router_aux_loss"] = float(outputs.router_loss.detach())
    return loss, metrics


def _rollout_correction(
    old_log_probs: torch.Tensor,
    micro: DataProto,
    mask: torch.Tensor,
    device: torch.device,
    from_update: bool,
    is_cap: float | None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The truncated importance weights of the policy loss (None: none) and, when this update stands in for
    the old log-prob pass, the metrics the driver would have computed from that pass."""
    if ROLLOUT_IS_WEIGHTS in micro.batch.keys():  # the driver computed them from the pass
        return micro.batch[ROLLOUT_IS_WEIGHTS].to(device), {}
    if not from_update or ROLLOUT_LOG_PROBS not in micro.batch.keys():
        return None, {}
    rollout_log_probs = micro.batch[ROLLOUT_LOG_PROBS].to(device)
    metrics = logprob_gap_metrics(old_log_probs, rollout_log_probs, mask)
    if is_cap is None:
        return None, metrics
    weights, is_metrics = truncated_is_weights(old_log_probs, rollout_log_probs, mask, is_cap)
    return weights, {**metrics, **is_metrics}


def actor_loss_from_log_probs(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    micro: DataProto,
    device: torch.device,
    actor_cfg: dict[str, Any],
    is_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The same loss from the response tokens' log-probs and entropies [b, R] (any backend computes those).
    Without `old_log_probs` in the batch the update makes one optimizer step, so pi_old is the policy this
    forward runs: its log-probs, detached (trainer/old_log_prob_pass.py). `is_cap`: rollout.tis_imp_ratio_cap,
    applied here when the driver had no old log-probs to compute the weights from."""
    mode = actor_cfg["loss_agg_mode"]
    mask = response_mask(micro).to(device)
    entropy_coeff = actor_cfg["entropy_coeff"]
    entropy_loss = agg_loss(entropy, mask, mode)
    from_update = OLD_LOG_PROBS not in micro.batch.keys()
    old_log_probs = log_probs.detach() if from_update else micro.batch[OLD_LOG_PROBS].to(device)
    is_weights, correction_metrics = _rollout_correction(old_log_probs, micro, mask, device, from_update, is_cap)

    policy = compute_policy_loss(
        old_log_prob=old_log_probs,
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
    metrics = {name: float(value.detach()) for name, value in policy.items()} | correction_metrics
    metrics["entropy"] = float(entropy_loss.detach())
    if actor_cfg["use_kl_loss"]:
        kl = kl_penalty(log_probs, micro.batch["ref_log_prob"].to(device), actor_cfg["kl_loss_type"])
        kl_loss = agg_loss(kl, mask, mode)
        loss = loss + actor_cfg["kl_loss_coef"] * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())
        metrics["kl_coef"] = actor_cfg["kl_loss_coef"]
    return loss, metrics
