"""How `DataProto.concat` merges the meta_info of its items (e.g. the outputs of several workers, or the
batches of several generation calls).

`meta_info["metrics"]` is gathered: each item's metrics dict (or list of dicts) becomes one entry per key,
so {"loss": 0.5} from two workers gives {"loss": [0.5, 0.7]}.

Per-batch keys describe the call that made one batch: its sampling `seed`, the actor weights version the
rollout engine generated it with. Batches of different steps or draws differ in them by design, so concat
combines their values with the key's rule (`PER_BATCH_KEYS`): the first item's seed, the oldest weights
version (the rows that lag most). `register_per_batch_key` adds a key of your own.

Any other key must hold the same value in every item that has it; different values raise, naming the key
(silently keeping one would hide the disagreement).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from protocol.arrays import values_equal
from protocol.errors import ProtocolTypeError, ProtocolValueError

METRICS_KEY = "metrics"
SEED_KEY = "seed"  # sampling seed of a generate call (workers/rollout/sampling.py)
ROLLOUT_WEIGHTS_VERSION = "rollout_weights_version"  # the actor weights version an engine generated a batch with

Combine = Callable[[list[Any]], Any]


PER_BATCH_KEYS: dict[str, Combine] = {SEED_KEY: itemgetter(0), ROLLOUT_WEIGHTS_VERSION: min}


def register_per_batch_key(key: str, combine: Combine) -> None:
    """Let `meta_info[key]` differ between concatenated items: `combine(values in item order)` gives the
    merged value. Register in the process that concatenates (the driver, for a worker group's outputs)."""
    if key == METRICS_KEY:
        raise ValueError(f"meta_info[{METRICS_KEY!r}] is always gathered per item; it takes no rule")
    PER_BATCH_KEYS[key] = combine


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _metrics_dicts(value: Any, item: int) -> list[Mapping[str, Any]]:
    dicts = list(value) if isinstance(value, (list, tuple)) else [value]
    for entry in dicts:
        if not isinstance(entry, Mapping):
            raise ProtocolTypeError(
                f"concat: item {item} has meta_info['metrics'] of type {type(entry).__name__}; expected a dict "
                "of metric name -> value (or a list of such dicts)"
            )
    return dicts


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One meta_info for the concatenation of items whose meta_info are `metas`, in item order."""
    merged: dict[str, Any] = {}
    source: dict[str, int] = {}
    metrics: dict[str, list[Any]] = {}
    per_batch: dict[str, list[Any]] = {}
    saw_metrics = False
    for item, meta in enumerate(metas):
        for key, value in meta.items():
            if key == METRICS_KEY:
                if value is None:
                    continue
                saw_metrics = True
                for entry in _metrics_dicts(value, item):
                    for name, metric in entry.items():
                        metrics.setdefault(name, []).append(metric)
            elif key in PER_BATCH_KEYS:
                per_batch.setdefault(key, []).append(value)
                merged.setdefault(key, value)  # keeps the key's place in the order of first appearance
            elif key not in merged:
                merged[key], source[key] = value, item
            elif not values_equal(merged[key], value):
                raise ProtocolValueError(
                    f"concat: meta_info[{key!r}] is {_short(merged[key])} in item {source[key]} but {_short(value)} "
                    f"in item {item}; only meta_info['metrics'] and the per-batch keys {sorted(PER_BATCH_KEYS)} "
                    "may differ (protocol.meta_merge.register_per_batch_key adds one)"
                )
    for key, values in per_batch.items():
        merged[key] = PER_BATCH_KEYS[key](values)
    if saw_metrics:
        merged[METRICS_KEY] = metrics
    return merged
