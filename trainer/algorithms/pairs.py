"""Preference pairs from scored samples: best vs worst response of each prompt."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

__all__ = ["form_pairs"]


def score_groups(
    scores: torch.Tensor | np.ndarray | Sequence[float], group_ids: np.ndarray | Sequence[object], caller: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each group's (row indices, scores), in order of the group's first row; checks the inputs first."""
    values = np.asarray(scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores, dtype=np.float64)
    groups = np.asarray(group_ids, dtype=object)
    if values.ndim != 1 or groups.ndim != 1 or len(values) != len(groups):
        raise ValueError(f"scores {values.shape} and group_ids {groups.shape} must be 1-D of the same length")
    if not np.isfinite(values).all():
        raise ValueError(f"{caller} needs finite scores")
    for group in dict.fromkeys(groups.tolist()):  # first-appearance order
        rows = np.flatnonzero(groups == group)
        yield rows, values[rows]


def form_pairs(
    scores: torch.Tensor | np.ndarray | Sequence[float], group_ids: np.ndarray | Sequence[object]
) -> tuple[np.ndarray, np.ndarray, int]:
    """Row indices of (chosen, rejected) pairs, one per group, and the number of groups dropped.

    Rows sharing a group id are the samples of one prompt; groups may have any size and need not be
    contiguous. Chosen is the highest-scoring row, rejected the lowest (the first row wins among equal
    scores, so the result is deterministic). A group whose scores are all equal (including a group of one)
    gives no preference and is dropped. Pairs come in order of each group's first row.
    """
    chosen, rejected, dropped = [], [], 0
    for rows, group_scores in score_groups(scores, group_ids, "form_pairs"):
        best, worst = int(np.argmax(group_scores)), int(np.argmin(group_scores))
        if group_scores[best] == group_scores[worst]:
            dropped += 1
            continue
        chosen.append(rows[best])
        rejected.append(rows[worst])
    return np.asarray(chosen, dtype=np.int64), np.asarray(rejected, dtype=np.int64), dropped
