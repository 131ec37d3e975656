"""verl's `dapo` reward manager: the naive manager's scores plus DAPO's soft overlong penalty."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from trainer.reward_settings import OverlongBuffer

from .overlong import add_overlong_penalty


class DAPORewardManager:
    """Scores from `base` (the rule reward, or the environments' rewards in front of it) with the overlong
    penalty added on each response's last token when `overlong` is set (None: the scores of `base`, as verl's
    manager with the buffer off). Same call as `RuleRewardManager`; `score` also gives each response's task
    score before the penalty (verl's `acc`), which dynamic sampling and validation compare."""

    def __init__(self, base: Any, overlong: OverlongBuffer | None) -> None:
        self.base = base
        self.overlong = overlong
        self.tokenizer = base.tokenizer

    def score(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """([B, R] token scores with the penalty, [B] task scores without it, metrics)."""
        scores, metrics = self.base(data)
        acc = scores.sum(-1)
        if self.overlong is not None:
            buffer = self.overlong
            scores, penalty_metrics = add_overlong_penalty(
                scores, data.batch["response_mask"], buffer.limit, buffer.length, buffer.penalty_factor
            )
            if buffer.log:  # verl's overlong_buffer.log
                metrics.update(penalty_metrics)
        return scores, acc, metrics

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        scores, _, metrics = self.score(data)
        return scores, metrics
