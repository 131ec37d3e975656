"""Truncated importance sampling (TIS) for responses sampled by a policy other than the one being updated.

An engine that generated a batch with older weights (one-step-off training) or with other kernels
samples from pi_rollout, while the PPO ratio is taken against pi_old (the actor's own log-probs of the
batch). Each token's policy loss is weighted by min(pi_old / pi_rollout, cap), which corrects the sampling
mismatch while the cap bounds the variance.
"""

from __future__ import annotations

import torch

from .masked import masked_mean

# The batch key holding the per-token weights; the actor's policy loss applies them when present.
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
# The engine's log-probs of the tokens it sampled, and the actor's before the update (pi_old).
ROLLOUT_LOG_PROBS = "rollout_log_probs"
OLD_LOG_PROBS = "old_log_probs"
# Metrics that are extremes, not means: reduced over micro-batches and ranks with max / min when the update
# computes them (no old log-prob pass: trainer/old_log_prob_pass.py).
EXTREME_METRICS = {"rollout_is/ratio_max": "max", "rollout_is/ratio_min": "min", "rollout/logprob_gap_max": "max"}


def logprob_gap_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the trainer's for the same tokens (mean and max)."""
    mask = response_mask.to(old_log_probs.dtype)
    gap = (rollout_log_probs - old_log_probs).abs()
    return {
        "rollout/logprob_gap_mean": float(masked_mean(gap, mask)),
        "rollout/logprob_gap_max": float((gap * mask).max()),
    }


def truncated_is_weights(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weights min(exp(old - rollout), cap) [B, R] (0 outside the response) and metrics of the ratio."""
    if not cap >= 1.0:
        raise ValueError(f"the importance-sampling cap must be >= 1 (1 turns the correction into a no-op), got {cap}")
    mask = response_mask.to(old_log_probs.dtype)
    ratio = torch.exp(torch.clamp(old_log_probs - rollout_log_probs, min=-20.0, max=20.0))
    weights = torch.clamp(ratio, max=cap) * mask
    real = mask.bool()
    metrics = {
        "rollout_is/ratio_mean": float(masked_mean(ratio, mask)),
        "rollout_is/ratio_max": float(ratio[real].max()) if real.any() else 0.0,
        "rollout_is/ratio_min": float(ratio[real].min()) if real.any() else 0.0,
        "rollout_is/capped_fraction": float(masked_mean((ratio > cap).to(mask.dtype), mask)),
        "rollout_is/weight_mean": float(masked_mean(weights, mask)),
    }
    return weights, metrics
