"""DAPO's soft overlong punishment (verl's overlong buffer): a response that runs into the last `buffer_len`
tokens of the length limit loses reward linearly, down to `-penalty_factor` at the limit.

With L = data.max_response_length and a response of `length` tokens (its response_mask, EOS included):
penalty = min(0, -(length - (L - buffer_len)) / buffer_len * penalty_factor). It is added to the rule score
on the response's last token, so advantages see it; `acc`/`score` (algorithm.filter_groups.metric) stay the
rule score without it.
"""

from __future__ import annotations

import torch

from workers.rl_math.masked import last_valid_positions


def overlong_penalty(
    lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """The penalty [B] (<= 0) of responses of `lengths` [B] tokens."""
    if not 0 < buffer_len < max_response_length:
        raise ValueError(
            f"the overlong buffer length {buffer_len} must be in 1..{max_response_length - 1} "
            "(the response limit less one)"
        )
    exceed = lengths.to(torch.float32) - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def add_overlong_penalty(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`token_level_scores` [B, R] with each response's penalty added on its last token, and metrics: the mean
    penalty and the share of responses penalised."""
    penalty = overlong_penalty(response_mask.sum(-1), max_response_length, buffer_len, penalty_factor)
    last = last_valid_positions(response_mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)  # an empty response is not overlong and has no token to carry it
    scores = token_level_scores.clone()
    scores[rows, last[rows]] += penalty[rows].to(scores.dtype)
    return scores, {
        "overlong_penalty_mean": float(penalty.mean()),
        "overlong_fraction": float((penalty < 0).float().mean()),
    }
