"""Rejection sampling: the best response of each prompt, kept only when it scores well enough."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def best_per_prompt(
    scores: torch.Tensor | np.ndarray | Sequence[float], group_ids: np.ndarray | Sequence[object], min_score: float
) -> tuple[np.ndarray, int]:
    """Row indices of the highest-scoring row of each group whose best score is >= `min_score` (the first
    row wins among equal scores), in order of each group's first row; and the number of groups left out."""
    values = np.asarray(scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores, dtype=np.float64)
    groups = np.asarray(group_ids, dtype=object)
    if values.ndim != 1 or groups.ndim != 1 or len(values) != len(groups):
        raise ValueError(f"scores {values.shape} and group_ids {groups.shape} must be 1-D of the same length")
    if not np.isfinite(values).all():
        raise ValueError("best_per_prompt needs finite scores")
    kept, left_out = [], 0
    for group in dict.fromkeys(groups.tolist()):  # first-appearance order
        rows = np.flatnonzero(groups == group)
        best = rows[int(np.argmax(values[rows]))]
        if values[best] >= min_score:
            kept.append(best)
        else:
            left_out += 1
    return np.asarray(kept, dtype=np.int64), left_out
