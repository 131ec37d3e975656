"""GSPO's policy loss: PPO's clipped surrogate on a sequence-level importance ratio.

GSPO (Group Sequence Policy Optimization) replaces PPO's per-token ratio by one ratio per response, the
geometric mean of its token ratios, s_i = exp(mean_t(log pi(y_t) - log pi_old(y_t))), and clips that. Every
token of response i carries the ratio sg[s_i] * pi(y_t) / sg[pi(y_t)] (sg: stop-gradient): its value is s_i,
its gradient s_i * grad log pi(y_t). Averaged over the response's tokens (loss_agg_mode seq-mean-token-mean,
GSPO's own), that is exactly the gradient of the sequence objective A_i * s_i; other modes weight the
responses differently and are accepted as well.
"""

from __future__ import annotations

import torch

from .losses import agg_loss
from .masked import masked_mean

LOG_RATIO_BOUND = 20.0  # as the token-level loss: exp() of a larger log-ratio overflows and no clip undoes it


def sequence_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """log s_i [B]: the mean over each response's tokens of log pi - log pi_old (0 for an empty response)."""
    mask = response_mask.to(log_prob.dtype)
    return ((log_prob - old_log_prob) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def compute_gspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    token_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``L = max(-A s, -A clip(s, 1 - low, 1 + high))`` per token with the sequence ratio ``s`` above.

    Takes the arguments of ``compute_policy_loss`` and returns the same scalars; ``clip_ratio_c`` is
    accepted and unused (GSPO has no dual clip), so ``pg_clipfrac_lower`` is 0. ``pg_clipfrac`` is the
    fraction of real tokens whose response's ratio is clipped; ``ppo_kl`` the token-level k1 estimate.
    """
    del clip_ratio_c  # same call as the token-level loss; GSPO clips the sequence ratio only
    seq_log_ratio = sequence_log_ratio(log_prob, old_log_prob, response_mask)
    bounded = torch.clamp(seq_log_ratio.detach(), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    # Value s_i on every token of response i; gradient s_i * d log pi(y_t).
    ratio = torch.exp(bounded.unsqueeze(-1) + log_prob - log_prob.detach())

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).to(loss_mat.dtype), response_mask)
    if token_weights is not None:
        loss_mat = loss_mat * token_weights
    return {
        "pg_loss": agg_loss(loss_mat, response_mask, loss_agg_mode),
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).detach(),
        "pg_clipfrac_lower": torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device),
    }
