"""The policy losses selected by `actor.policy_loss.loss_mode` (names in trainer/algorithm_names.py)."""

from __future__ import annotations

from typing import Callable

import torch

from trainer.algorithm_names import POLICY_LOSS_MODES

from .gspo import compute_gspo_policy_loss
from .losses import compute_policy_loss

PolicyLoss = Callable[..., dict[str, torch.Tensor]]

POLICY_LOSSES: dict[str, PolicyLoss] = {"vanilla": compute_policy_loss, "gspo": compute_gspo_policy_loss}


def get_policy_loss(loss_mode: str) -> PolicyLoss:
    """The loss function of `loss_mode`; every one takes `compute_policy_loss`'s arguments."""
    if loss_mode not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss_mode {loss_mode!r}; valid: {list(POLICY_LOSS_MODES)}")
    return POLICY_LOSSES[loss_mode]
