"""Rejection sampling: the best response of each prompt, kept only when it scores well enough."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from trainer.algorithms.pairs import score_groups


def best_per_prompt(
    scores: torch.Tensor | np.ndarray | Sequence[float], group_ids: np.ndarray | Sequence[object], min_score: float
) -> tuple[np.ndarray, int]:
    """Row indices of the highest-scoring row of each group whose best score is >= `min_score` (the first
    row wins among equal scores), in order of each group's first row; and the number of groups left out."""
    kept, left_out = [], 0
    for rows, group_scores in score_groups(scores, group_ids, "best_per_prompt"):
        best = int(np.argmax(group_scores))
        if group_scores[best] >= min_score:
            kept.append(rows[best])
        else:
            left_out += 1
    return np.asarray(kept, dtype=np.int64), left_out
