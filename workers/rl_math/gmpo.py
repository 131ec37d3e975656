"""GMPO's policy objective (Geometric-Mean Policy Optimization, `policy_loss.loss_mode=geo_mean`, verl's name).

Each response i is weighted by the geometric mean of its tokens' ratios instead of their arithmetic mean:
s_i = exp(mean_t l_t), where l_t is log pi(y_t) - log pi_old(y_t) clipped to [-clip_low, clip_high] on the side
that would raise the objective (the pessimistic bound, as PPO's min, taken per token in log space: for A > 0 a
large l_t is cut, for A < 0 a small one). The loss of response i is -A_i * s_i, averaged over responses. A
geometric mean is less swayed by a few tokens with extreme ratios, so GMPO clips wider than PPO (e.g. 0.4 in log
space). The clip range is in log space: `clip_ratio_low=0.4` bounds the ratio at exp(-0.4).
"""

from __future__ import annotations

import torch

from .gspo import LOG_RATIO_BOUND
from .masked import masked_mean

# The aggregation GMPO's loss uses whatever actor.loss_agg_mode says: one loss per response, averaged over
# responses (workers/training/ppo_loop.py weighs micro-batches by the same units).
GMPO_AGG_MODE = "seq-mean-token-mean"


def gmpo_token_losses(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`([B, R] loss, clipped fraction)`: every token of response i carries -A_i * s_i (so that the token mean of
    a response is its loss), and the fraction of real tokens whose log-ratio the clip changed."""
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    clipped = torch.clamp(log_ratio, -clip_low, clip_high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)  # the bound that lowers the objective
    sequence_ratio = torch.exp(masked_mean(pessimistic, response_mask, dim=-1))
    sequence_advantage = masked_mean(advantages, response_mask, dim=-1)  # outcome advantages: the same on every token
    losses = (-sequence_advantage * sequence_ratio).unsqueeze(-1).expand_as(log_prob)
    changed = (pessimistic != log_ratio).to(log_prob.dtype)
    return losses, masked_mean(changed, response_mask).detach()
