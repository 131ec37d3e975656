"""The names of the choices the loss code implements (and the log-prob chunk's default), free of torch so that the
config checks (workers/config.py, trainer/config_loader.py) read the same values as the code that runs them."""

from __future__ import annotations

# How agg_loss (losses.py) reduces a per-token loss to a scalar.
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# actor.policy_loss.loss_mode: the clipped token-ratio PPO surrogate, GSPO's sequence-level ratio, or GMPO's
# geometric mean of clipped token ratios (compute_policy_loss in losses.py, gspo.py, gmpo.py).
POLICY_LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo", "geo_mean")

# Per-token KL estimators (kl.py): actor.kl_loss_type and algorithm.kl_penalty.
KL_PENALTY_NAMES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

# model.logits_chunk_tokens' default: tokens per chunk of the LM head's log-softmax (chunked_logits.py). float32
# logits of 2048 tokens x 152064 entries (Qwen2.5's vocabulary) are 1.2 GiB; the chunk is large enough that
# the head's matrix products stay efficient.
DEFAULT_LOGITS_CHUNK_TOKENS = 2048

# actor.old_log_prob_pass: skip the log-prob pass before the update when the update's own forward gives pi_old
# (auto, trainer/old_log_prob_pass.py), or run it before every update (always).
OLD_LOG_PROB_PASS_CHOICES: tuple[str, ...] = ("auto", "always")

# actor.router_replay.mode (verl's names): a mixture of experts' training forwards route as they will (disabled),
# replay the experts the log-prob pass chose (R2) or those the rollout engine chose (R3): workers/routing_replay.
ROUTER_REPLAY_MODES: tuple[str, ...] = ("disabled", "R2", "R3")
