"""Advantage estimators and their name -> function table.

Every estimator takes ``[batch, response_len]`` tensors plus a
``response_mask`` (1 = real response token, 0 = padding) and returns
``(advantages, returns)``, both ``[batch, response_len]`` and exactly 0 at
padding positions. Estimators run under ``torch.no_grad``: their outputs are
targets, not something to differentiate through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from workers.rl_math.masked import masked_whiten

__all__ = [
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "ADVANTAGE_ESTIMATORS",
    "get_advantage_estimator",
]

GroupIndex = np.ndarray | Sequence[Any]


def _keep(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with padding positions set to exactly 0 (robust to nan/inf there)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _sequence_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome score per row: ``[batch, len] -> [batch]`` sum of unmasked rewards."""
    return _keep(token_level_rewards, response_mask).sum(dim=-1)


def _discounted_return_to_go(
    rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over real tokens only, ``[batch, len]``.

    Masked positions are skipped (the running return passes through them
    unchanged and undiscounted) and report 0, so trailing padding acts as the
    terminal state and interior holes (e.g. tool-output tokens) are transparent.
    """
    real = response_mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        running = torch.where(real[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return _keep(out, response_mask)


def _group_stats(
    scores: torch.Tensor, group_index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row statistics of the row's prompt group.

    Args:
        scores: ``[batch]``.
        group_index: ``batch`` hashable ids (str/int/object); equal ids = same group.

    Returns:
        ``(count, total, mean, std)``, each ``[batch]``, describing the group of
        each row. ``std`` is unbiased (Bessel) and 0 for groups of size 1.
    """
    if isinstance(group_index, np.ndarray):
        if group_index.ndim != 1:
            raise ValueError(f"group_index must be 1-D, got shape {group_index.shape}")
        ids = group_index.tolist()  # numpy scalars -> python scalars (hashable, comparable)
    else:
        ids = list(group_index)
    if len(ids) != scores.shape[0]:
        raise ValueError(f"group_index has {len(ids)} entries but the batch has {scores.shape[0]} rows")

    slot: dict[Any, int] = {}
    slots = [slot.setdefault(i, len(slot)) for i in ids]
    inverse = torch.tensor(slots, dtype=torch.long, device=scores.device)
    n_groups = len(slot)

    def per_group_sum(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, v)

    count = per_group_sum(torch.ones_like(scores))
    total = per_group_sum(scores)
    mean = total / count
    sq_dev = per_group_sum((scores - mean[inverse]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return count[inverse], total[inverse], mean[inverse], std[inverse]


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation.

    ``delta_t = r_t + gamma * V_{next} - V_t``; ``A_t = delta_t + gamma * lam * A_{next}``
    where "next" is the next *real* token. Masked positions are skipped: their
    reward and value are never read, so a value stored after the end of the
    response cannot leak into the bootstrap (the state after the last real
    token is terminal, ``V = 0``).

    Args:
        token_level_rewards: ``[batch, len]``.
        values: ``[batch, len]`` critic values ``V_t``.
        response_mask: ``[batch, len]``.

    Returns:
        ``advantages`` (whitened over real tokens) and ``returns = A_t + V_t``
        (un-whitened), both ``[batch, len]`` and 0 at padding.
    """
    real = response_mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    running_adv = torch.zeros_like(values[:, 0])
    raw_adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        # On padding keep the carries unchanged so the previous real token sees
        # the next real token (or the terminal state) directly.
        running_adv = torch.where(real[:, t], delta + gamma * lam * running_adv, running_adv)
        next_value = torch.where(real[:, t], values[:, t], next_value)
        raw_adv[:, t] = running_adv
    returns = _keep(raw_adv + values, response_mask)
    advantages = _keep(masked_whiten(raw_adv, response_mask), response_mask)
    return advantages, returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: score normalised within its prompt group, broadcast to tokens.

    ``score_i = sum_t r_{i,t}``; ``A_i = score_i - mean_g`` and, if
    ``norm_adv_by_std``, divided by ``std_g + epsilon`` (unbiased std).
    Convention for a group of size 1: ``mean = 0`` and ``std = 1``, so the
    advantage is the raw score (divided by ``1 + epsilon`` when normalising).

    Args:
        token_level_rewards, response_mask: ``[batch, len]``.
        group_index: ``[batch]`` prompt-group ids (str/int/object).

    Returns:
        ``(advantages, returns)``, identical, ``[batch, len]``, 0 at padding.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    count, _, mean, std = _group_stats(scores, group_index)
    alone = count <= 1
    adv = scores - torch.where(alone, torch.zeros_like(mean), mean)
    if norm_adv_by_std:
        adv = adv / (torch.where(alone, torch.ones_like(std), std) + epsilon)
    adv_tokens = _keep(adv[:, None].expand_as(token_level_rewards), response_mask)
    return adv_tokens, adv_tokens.clone()


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``A_i = score_i - mean(scores of the other rows of the group)``.

    A group of size 1 has no "others" and hence no baseline; such rows get
    advantage 0 (no learning signal) rather than the raw, unbaselined score.

    Args:
        token_level_rewards, response_mask: ``[batch, len]``.
        group_index: ``[batch]`` prompt-group ids.

    Returns:
        ``(advantages, returns)``, identical, ``[batch, len]``, 0 at padding.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    count, total, _, _ = _group_stats(scores, group_index)
    loo_mean = (total - scores) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores - loo_mean, torch.zeros_like(scores))
    adv_tokens = _keep(adv[:, None].expand_as(token_level_rewards), response_mask)
    return adv_tokens, adv_tokens.clone()


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}`` over real tokens (padding skipped).

    Args:
        token_level_rewards, response_mask: ``[batch, len]``.

    Returns:
        ``advantages`` = ``G`` whitened over real tokens, ``returns`` = raw ``G``;
        both ``[batch, len]`` and 0 at padding.
    """
    returns = _discounted_return_to_go(token_level_rewards, response_mask, gamma)
    advantages = _keep(masked_whiten(returns, response_mask), response_mask)
    return advantages, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: GroupIndex,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline.

    ``score_i - mean_g`` (a group of size 1 uses mean 0, as in GRPO) is
    broadcast to the row's real tokens and then whitened over all real tokens
    of the batch (so longer responses weigh more in the statistics);
    ``epsilon`` is added to the variance inside the whitening.

    Args:
        token_level_rewards, response_mask: ``[batch, len]``.
        group_index: ``[batch]`` prompt-group ids.

    Returns:
        ``(advantages, returns)``, identical, ``[batch, len]``, 0 at padding.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    count, _, mean, _ = _group_stats(scores, group_index)
    centred = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
    tokens = _keep(centred[:, None].expand_as(token_level_rewards), response_mask)
    adv_tokens = _keep(masked_whiten(tokens, response_mask, eps=epsilon), response_mask)
    return adv_tokens, adv_tokens.clone()


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: undiscounted return-to-go minus the greedy rollout's reward.

    Args:
        token_level_rewards, response_mask: ``[batch, len]``.
        reward_baselines: ``[batch]`` score of the greedy response to the same prompt.

    Returns:
        ``advantages = G_t - baseline`` and ``returns = G_t``, both
        ``[batch, len]``, 0 at padding. No whitening.
    """
    returns = _discounted_return_to_go(token_level_rewards, response_mask, gamma=1.0)
    advantages = _keep(returns - reward_baselines.to(returns.dtype)[:, None], response_mask)
    return advantages, returns


# Signatures differ per estimator (GAE needs values, ReMax baselines, the
# group-based ones group ids): callers pick the arguments that match the name.
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": compute_gae_advantage_return,
    "grpo": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "remax": compute_remax_outcome_advantage,
}


def get_advantage_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Look up an estimator in :data:`ADVANTAGE_ESTIMATORS`; ValueError lists valid names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"Unknown advantage estimator {name!r}; valid names: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None
