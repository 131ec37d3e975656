"""Pure-torch RL post-training algorithms: the driver's advantage estimators and KL controllers here, and the
math the workers run (masked ops, policy (PPO, GSPO) and value losses, entropy/log-prob helpers, per-token KL
penalties) re-exported from ``workers/rl_math/``, where it lives below the workers that call it."""

from workers.rl_math.kl import KL_PENALTY_NAMES, kl_penalty
from workers.rl_math.logits import entropy_from_logits, log_probs_from_logits
from workers.rl_math.losses import LOSS_AGG_MODES, agg_loss, compute_policy_loss, compute_value_loss
from workers.rl_math.masked import last_valid_positions, masked_mean, masked_sum, masked_var, masked_whiten

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_advantage_estimator,
)
from .kl_control import AdaptiveKLController, FixedKLController, KLController, apply_kl_penalty, make_kl_controller

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_PENALTY_NAMES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "get_advantage_estimator",
    "kl_penalty",
    "log_probs_from_logits",
    "make_kl_controller",
    "last_valid_positions",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]
