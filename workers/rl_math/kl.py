"""Per-token KL estimators (the actor's KL loss; the driver's KL-in-reward uses them too)."""

from __future__ import annotations

import torch

from .names import KL_PENALTY_NAMES

__all__ = ["KL_PENALTY_NAMES", "kl_penalty"]


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) from samples of the policy.

    With ``d = log_prob - ref_log_prob``:
        ``kl``/``k1``: ``d`` (unbiased, high variance, can be negative);
        ``abs``: ``|d|``;
        ``mse``/``k2``: ``0.5 * d^2``;
        ``low_var_kl``/``k3``: ``exp(-d) + d - 1`` (unbiased, >= 0), clamped to [-10, 10].
    The inputs are ``[batch, len]`` (any equal shapes); the result has their shape.
    """
    name = kl_penalty
    d = log_prob - ref_log_prob
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return d.abs()
    if name in ("mse", "k2"):
        return 0.5 * d**2
    if name in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(-d, min=-20.0, max=20.0)  # keep exp finite
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"Unknown kl_penalty {name!r}; valid names: {list(KL_PENALTY_NAMES)}")
