"""Driver side of an SFT update: chosen rollout rows, padded with untrained rows so the ranks split evenly."""

from __future__ import annotations

import numpy as np
import torch

from protocol import DataProto
from workers.training.sft_update import SFT_KEYS


def sft_batch(rollout: DataProto, rows: np.ndarray, world_size: int) -> DataProto:
    """The `rows` of `rollout` (sequence keys only) with `loss_mask` 1, plus copies of the first rows with
    `loss_mask` 0 until `world_size` divides the count: the group's own padding would train on them twice."""
    if len(rows) == 0:
        raise ValueError("sft_batch needs at least one row")
    chosen = DataProto.from_dict({key: rollout.batch[key][torch.as_tensor(rows)] for key in SFT_KEYS})
    chosen.batch["loss_mask"] = torch.ones_like(chosen.batch["response_mask"])
    padded, pad = chosen.pad_to_divisor(world_size)
    if pad:
        padded.batch["loss_mask"][-pad:] = 0
    return padded
