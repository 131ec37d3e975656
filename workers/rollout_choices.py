"""The values the rollout settings may take, read by the worker config's checks (workers/config.py) and by the
driver that acts on them (trainer/rollout_settings.py, the rollout pipeline, the async buffer). Free of torch."""

from __future__ import annotations

STALENESS_VALUES = (0, 1)  # steps between the weights that generate a batch and the update that uses it
ROLLOUT_MODES = ("sync", "async")  # whole batches per step | a continuous stream of finished prompt groups
STALE_GROUP_POLICIES = ("wait", "drop", "regenerate")  # mode=async: a group about to exceed max_staleness
PARTIAL_ROLLOUT_MODES = ("continue", "abort")  # mode=async: responses in flight at a weight update
