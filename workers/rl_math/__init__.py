"""The RL math the workers run: masked reductions, log-probs and entropy from logits, the policy (PPO, GSPO),
value and DPO losses, per-token KL estimators, truncated importance sampling, and the names of their choices.

Plain torch on tensors, below the workers that call it (it imports nothing else of the project). Each module
has one job; import from the module (`from workers.rl_math.losses import agg_loss`): this file imports nothing,
so `names.py` stays free of torch for the config checks. The driver's own math (advantage estimators, KL
controllers, preference pairs, rejection sampling) is in `trainer/algorithms/`, which also re-exports these.
"""
