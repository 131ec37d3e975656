"""The values the rollout settings may take, read by the worker config's checks (workers/config.py) and by the
driver that acts on them (trainer/rollout_settings.py, the rollout pipeline, the async buffer). Free of torch."""

from __future__ import annotations

STALENESS_VALUES = (0, 1)  # steps between the weights that generate a batch and the update that uses it
# verl's rollout.mode (its offline-batch engine | its rollout servers); both give the same rollout here
# (trainer/verl_keys.py, NO_EFFECT_KEYS)
ROLLOUT_MODES = ("sync", "async")
# rollout.async_training=true: the separate engines stream finished prompt groups, a step takes a batch when ready
STALE_GROUP_POLICIES = ("wait", "drop", "regenerate")  # async_training: a group about to exceed max_staleness
PARTIAL_ROLLOUT_MODES = ("continue", "abort")  # async_training: responses in flight at a weight update
# The async-training-only keys and their defaults: a non-default value needs rollout.async_training=true
ASYNC_TRAINING_DEFAULTS = {"max_staleness": 1, "stale_groups": "wait", "partial_rollout": "continue"}
