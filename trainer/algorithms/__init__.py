"""Pure-torch RL post-training algorithms: masked ops, advantage estimators,
policy (PPO, GSPO) and value losses, entropy/log-prob helpers, KL penalties and controllers."""

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
from .kl import (
    KL_PENALTY_NAMES,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from .logits import entropy_from_logits, log_probs_from_logits
from .losses import LOSS_AGG_MODES, agg_loss, compute_policy_loss, compute_value_loss
from .masked import last_valid_positions, masked_mean, masked_sum, masked_var, masked_whiten

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
