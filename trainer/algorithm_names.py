"""The names of the algorithm choices the loss code implements, free of torch so that the config check
(trainer/config_loader.py) reads the same lists as the code that runs them."""

from __future__ import annotations

# How agg_loss (trainer/algorithms/losses.py) reduces a per-token loss to a scalar.
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# actor.policy_loss.loss_mode: the clipped token-ratio PPO surrogate, or GSPO's sequence-level ratio
# (compute_policy_loss in trainer/algorithms/losses.py, the ratio in gspo.py).
POLICY_LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo")

# algorithm.filter_groups.metric (DAPO dynamic sampling, trainer/dynamic_sampling.py): `acc` and `score` are the
# rule reward's score of a response, `seq_reward` its summed token scores (rule score, reward model and
# overlong penalty), `seq_final_reward` its summed token rewards (the same unless KL goes into the reward).
FILTER_GROUPS_METRICS: tuple[str, ...] = ("acc", "score", "seq_reward", "seq_final_reward")
