"""The names of the driver's algorithm choices, free of torch so that the config check (trainer/config_loader.py)
reads the same lists as the code that runs them (the loss code's names: workers/rl_math/names.py)."""

from __future__ import annotations

# algorithm.filter_groups.metric (DAPO dynamic sampling, trainer/dynamic_sampling.py): `acc` and `score` are the
# rule reward's score of a response, `seq_reward` its summed token scores (rule score, reward model and
# overlong penalty), `seq_final_reward` its summed token rewards (the same unless KL goes into the reward).
FILTER_GROUPS_METRICS: tuple[str, ...] = ("acc", "score", "seq_reward", "seq_final_reward")

# algorithm.adv_estimator: every estimator trainer/algorithms/advantages.py registers (a test keeps the two equal),
# and the config group (trainer/config/algorithm/) whose defaults go with it. A verl script names the estimator
# alone (`algorithm.adv_estimator=gae`): the run then takes that group's defaults, not GRPO's (rollout.n=8).
ESTIMATOR_GROUPS: dict[str, str] = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp",
    "remax": "remax",
}
ADVANTAGE_ESTIMATOR_NAMES: tuple[str, ...] = tuple(ESTIMATOR_GROUPS)

# algorithm.kl_ctrl.type (trainer/algorithms/kl_control.py)
KL_CONTROLLER_KINDS: tuple[str, ...] = ("fixed", "adaptive")
