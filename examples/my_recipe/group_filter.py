"""Group-relative advantages that skip prompts whose samples all score alike (a module of my recipe's folder)."""

from __future__ import annotations

import numpy as np
import torch


def group_advantages(scores: torch.Tensor, uids: np.ndarray, min_spread: float, scale_by_std: bool) -> tuple[torch.Tensor, np.ndarray]:
    """Each response's score minus the mean score of its prompt (divided by their std when `scale_by_std`),
    and the rows of the prompts whose best and worst scores differ by more than `min_spread`."""
    advantages = torch.zeros_like(scores)
    kept = []
    for uid in dict.fromkeys(uids.tolist()):
        rows = np.flatnonzero(uids == uid)
        group = scores[torch.as_tensor(rows)]
        if float(group.max() - group.min()) <= min_spread:
            continue  # every sample scored alike: no signal for this prompt
        centred = group - group.mean()
        advantages[torch.as_tensor(rows)] = centred / (group.std() + 1e-6) if scale_by_std else centred
        kept.extend(rows.tolist())
    return advantages, np.asarray(kept, dtype=np.int64)
