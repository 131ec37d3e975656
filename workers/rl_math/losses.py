"""Loss aggregation, the PPO (dual-clip) policy loss and the clipped value loss."""

from __future__ import annotations

import torch

from .gmpo import GMPO_AGG_MODE, gmpo_token_losses
from .gspo import LOG_RATIO_BOUND, gspo_token_ratios
from .masked import masked_mean, masked_sum
from .names import LOSS_AGG_MODES, POLICY_LOSS_MODES

__all__ = ["LOSS_AGG_MODES", "agg_loss", "compute_policy_loss", "compute_value_loss"]


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Reduce a per-token loss ``[batch, len]`` to a scalar ``[]``. Modes:
        ``token-mean``: mean over every real token of the batch.
        ``seq-mean-token-sum``: per-sequence token sum, then mean over sequences.
        ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences.
        ``seq-mean-token-sum-norm``: per-sequence token sum divided by the
            padded length ``len`` (a constant, so the weight of a token does not
            depend on its response's length), then mean over sequences.

    The ``seq-mean-*`` modes average over sequences with at least one real
    token, so fully-padded rows neither contribute nor dilute.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)

    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = masked_mean(loss_mat, loss_mask, dim=-1)
    else:
        per_seq = masked_sum(loss_mat, loss_mask, dim=-1)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            per_seq = per_seq / loss_mat.shape[-1]
    non_empty = (loss_mask.expand_as(loss_mat) != 0).any(dim=-1)
    return masked_mean(per_seq, non_empty)


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    token_weights: torch.Tensor | None = None,
    loss_mode: str = "vanilla",
) -> dict[str, torch.Tensor]:
    """Clipped PPO surrogate with dual clip for negative advantages (``loss_mode="vanilla"``), or GSPO's.

    With ``r = exp(log_prob - old_log_prob)``:
    ``L = max(-A r, -A clip(r, 1 - low, 1 + high))`` and, where ``A < 0``,
    additionally ``L = min(L, -A c)`` (dual clip: bounds the loss when a
    token that became much *more* likely has a negative advantage).
    ``loss_mode="gspo"``: ``r`` is the response's sequence ratio on every token (``gspo.py``) and there is
    no dual clip (``clip_ratio_c`` unused, ``pg_clipfrac_lower`` 0), as in GSPO.

    ``old_log_prob``, ``log_prob`` (the only one carrying gradient), ``advantages``, ``response_mask`` and the
    optional ``token_weights`` (factors of each token's loss before aggregation, e.g. truncated importance-sampling
    weights, see ``rollout_correction.py``) are ``[batch, len]``. Returns scalars ``[]``: ``pg_loss`` (aggregated
    with ``loss_agg_mode``), ``pg_clipfrac`` (fraction of real tokens where the ratio clip binds), ``ppo_kl``
    (masked mean of ``old_log_prob - log_prob``, the k1 estimate of KL(old || new) on samples from old),
    ``pg_clipfrac_lower`` (fraction where the dual clip binds). ValueError if ``clip_ratio_c <= 1`` (the dual-clip
    bound must lie above the unclipped ratio of 1), or for an unknown ``loss_mode``.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    if loss_mode not in POLICY_LOSS_MODES:
        raise ValueError(f"unknown policy loss_mode {loss_mode!r}; valid: {list(POLICY_LOSS_MODES)}")
    if loss_mode == "geo_mean":
        return _geo_mean_policy_loss(
            old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, token_weights
        )

    log_ratio = log_prob - old_log_prob
    if loss_mode == "gspo":
        ratio = gspo_token_ratios(log_prob, old_log_prob, response_mask)
    else:  # clamp before exp: a huge ratio would overflow to inf and the clip cannot undo that
        ratio = torch.exp(torch.clamp(log_ratio, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND))
    ppo_kl = masked_mean(-log_ratio, response_mask).detach()

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).to(loss_ppo.dtype), response_mask)

    loss_dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    if loss_mode == "gspo":  # GSPO clips the sequence ratio only
        negative = torch.zeros_like(negative)
    loss_mat = torch.where(negative, torch.minimum(loss_ppo, loss_dual_bound), loss_ppo)
    dual_active = negative & (loss_ppo > loss_dual_bound)
    clipfrac_lower = masked_mean(dual_active.to(loss_ppo.dtype), response_mask)
    if token_weights is not None:
        loss_mat = loss_mat * token_weights

    return {
        "pg_loss": agg_loss(loss_mat, response_mask, loss_agg_mode),
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": ppo_kl,
        "pg_clipfrac_lower": clipfrac_lower.detach(),
    }


def _geo_mean_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    token_weights: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """GMPO (gmpo.py): one loss per response, averaged over responses. Token weights (truncated importance
    sampling) enter as their geometric mean over the response, as the ratios do."""
    loss_mat, clipfrac = gmpo_token_losses(log_prob, old_log_prob, advantages, response_mask, clip_low, clip_high)
    if token_weights is not None:
        log_weight = masked_mean(torch.log(token_weights.clamp(min=1e-10)), response_mask, dim=-1)
        loss_mat = loss_mat * torch.exp(log_weight).unsqueeze(-1)
    return {
        "pg_loss": agg_loss(loss_mat, response_mask, GMPO_AGG_MODE),
        "pg_clipfrac": clipfrac,
        "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).detach(),
        "pg_clipfrac_lower": torch.zeros((), dtype=log_prob.dtype, device=log_prob.device),
    }


def compute_value_loss(
    vpreds: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * max((v - R)^2, (v_clip - R)^2)``.

    ``v_clip = values_old + clamp(v - values_old, -cliprange_value, cliprange_value)``
    keeps the critic from moving far from the values the advantages were built on. The inputs are
    ``[batch, len]``; returns scalars ``(vf_loss, vf_clipfrac)``, the latter the fraction of real tokens where
    the clipped branch is the larger one.
    """
    vpreds_clipped = values_old + torch.clamp(vpreds - values_old, -cliprange_value, cliprange_value)
    err_unclipped = (vpreds - returns) ** 2
    err_clipped = (vpreds_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((err_clipped > err_unclipped).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac.detach()
