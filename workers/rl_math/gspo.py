"""GSPO's importance ratio: one ratio per response, on each of its tokens.

GSPO (Group Sequence Policy Optimization) replaces PPO's per-token ratio by one ratio per response, the
geometric mean of its token ratios, s_i = exp(mean_t(log pi(y_t) - log pi_old(y_t))), and clips that
(`compute_policy_loss(..., loss_mode="gspo")` in losses.py). Every token of response i carries the ratio
sg[s_i] * pi(y_t) / sg[pi(y_t)] (sg: stop-gradient): its value is s_i, its gradient s_i * grad log pi(y_t).
Averaged over the response's tokens (loss_agg_mode seq-mean-token-mean, GSPO's own) that is exactly the
gradient of the sequence objective A_i * s_i; other aggregation modes weight the responses differently.
"""

from __future__ import annotations

import torch

from .masked import masked_mean

LOG_RATIO_BOUND = 20.0  # exp() of a larger log-ratio overflows, and no clip undoes an inf


def sequence_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """log s_i [B]: the mean over each response's tokens of log pi - log pi_old (0 for an empty response)."""
    return masked_mean(log_prob - old_log_prob, response_mask, dim=-1)


def gspo_token_ratios(log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, R]: s_i on every token of response i, with the gradient s_i * d log pi(y_t) (module docstring)."""
    seq = torch.clamp(
        sequence_log_ratio(log_prob, old_log_prob, response_mask).detach(), -LOG_RATIO_BOUND, LOG_RATIO_BOUND
    )
    return torch.exp(seq.unsqueeze(-1) + log_prob - log_prob.detach())
