"""KL-in-reward shaping and KL coefficient controllers (the driver's side of KL; the per-token estimators
are in workers/rl_math/kl.py)."""

from __future__ import annotations

from typing import Protocol

import torch

from trainer.algorithm_names import KL_CONTROLLER_KINDS
from workers.rl_math import kl
from workers.rl_math.losses import agg_loss

__all__ = [
    "apply_kl_penalty",
    "KLController",
    "FixedKLController",
    "AdaptiveKLController",
    "make_kl_controller",
]


class KLController(Protocol):
    """Anything that exposes a KL coefficient and can be told the observed KL."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Ignore the observation: the coefficient stays fixed."""


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl``.

    ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + error * n_steps / horizon``, so the coefficient changes by at
    most 20% per ``horizon`` samples.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after observing ``current_kl`` over ``n_steps`` samples."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(
    kind: str,
    kl_coef: float,
    target_kl: float | None = None,
    horizon: int | None = None,
) -> FixedKLController | AdaptiveKLController:
    """Build a controller: ``"fixed"`` uses ``kl_coef``; ``"adaptive"`` starts at
    ``kl_coef`` and also needs ``target_kl`` and ``horizon``."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"Unknown KL controller kind {kind!r}; valid kinds: {list(KL_CONTROLLER_KINDS)}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
    update_controller: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-reward: ``rewards = scores - beta * KL_t`` on real tokens.

    ``beta`` is ``kl_ctrl.value`` *before* this call's update. The batch KL
    reported (and fed to the controller with ``n_steps = batch``) is the
    per-sequence mean of ``KL_t``, averaged over non-empty sequences.

    Args:
        token_level_scores, log_prob, ref_log_prob, response_mask: ``[batch, len]``.
        kl_ctrl: e.g. from :func:`make_kl_controller`.
        kl_penalty: estimator name, see ``workers/rl_math/kl.py``.
        update_controller: set False to leave ``kl_ctrl`` untouched.

    Returns:
        ``token_level_rewards`` ``[batch, len]`` (padding keeps its score) and
        metrics ``{"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}``.
    """
    kld = kl.kl_penalty(log_prob, ref_log_prob, kl_penalty)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(agg_loss(kld, response_mask, "seq-mean-token-mean"))
    if update_controller:
        kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": beta,
    }
