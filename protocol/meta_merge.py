"""How `DataProto.concat` merges the meta_info of its items (e.g. the outputs of several workers).

`meta_info["metrics"]` is gathered: each item's metrics dict (or list of dicts) becomes one entry per key,
so {"loss": 0.5} from two workers gives {"loss": [0.5, 0.7]}. Any other key must hold the same value in
every item that has it; different values raise, naming the key (silently keeping one would hide the
disagreement).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.arrays import values_equal
from protocol.errors import ProtocolTypeError, ProtocolValueError

METRICS_KEY = "metrics"


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
            elif key not in merged:
                merged[key], source[key] = value, item
            elif not values_equal(merged[key], value):
                raise ProtocolValueError(
                    f"concat: meta_info[{key!r}] is {_short(merged[key])} in item {source[key]} but {_short(value)} in item "
                    f"{item}; only meta_info['metrics'] is gathered per item, other keys must agree"
                )
    if saw_metrics:
        merged[METRICS_KEY] = metrics
    return merged
