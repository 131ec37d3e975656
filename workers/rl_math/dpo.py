"""Direct Preference Optimization losses on sequence log-probs (sigmoid / IPO / hinge)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["DPO_LOSS_TYPES", "dpo_loss"]

DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo", "hinge")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses ``[P]`` and the implicit rewards of the chosen and rejected responses ``[P]``.

    Inputs are summed response log-probs ``[P]``. With ``h = (pi_c - pi_r) - (ref_c - ref_r)``:
        ``sigmoid``: ``-(1 - eps) * logsigmoid(beta * h) - eps * logsigmoid(-beta * h)`` (eps = label
            smoothing: the assumed probability that a preference label is flipped; conservative DPO).
        ``ipo``: ``(h - 1 / (2 * beta)) ** 2`` (pulls the log-ratio gap to a finite target instead of
            pushing it to infinity).
        ``hinge``: ``relu(1 - beta * h)`` (SLiC: no gradient once the margin exceeds 1 / beta).
    The implicit reward of a response is ``beta * (pi - ref)``; the rewards are detached (metrics only).
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid types: {list(DPO_LOSS_TYPES)}")
    if not beta > 0:
        raise ValueError(f"DPO beta must be > 0, got {beta!r}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"DPO label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing is defined for loss_type 'sigmoid' only, got loss_type {loss_type!r}")
    chosen_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_ratio = policy_rejected_logps - ref_rejected_logps
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * h)
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()
