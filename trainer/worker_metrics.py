"""Metrics that every rank of a worker group reports, made one figure per key."""

from __future__ import annotations


def mean_over_workers(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """Each key averaged over the workers that reported it."""
    keys = sorted({k for metrics in per_worker for k in metrics})
    return {k: sum(m[k] for m in per_worker if k in m) / sum(1 for m in per_worker if k in m) for k in keys}
