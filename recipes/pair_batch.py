"""Driver side of the DPO pair layout: rollout rows -> one row per pair, padded to split evenly over ranks."""

from __future__ import annotations

import numpy as np
import torch

from protocol import DataProto
from workers.rl_math.masked import masked_sum
from workers.training.dpo_update import SIDE_KEYS


def pack_pairs(rollout: DataProto, chosen: np.ndarray, rejected: np.ndarray) -> DataProto:
    """One row per pair: `chosen_<key>` / `rejected_<key>` for every sequence key, and `weight` = 1."""
    if len(chosen) != len(rejected) or len(chosen) == 0:
        raise ValueError(
            f"pack_pairs needs as many chosen as rejected rows, at least one; got {len(chosen)} and {len(rejected)}"
        )
    tensors = {
        f"{side}_{key}": rollout.batch[key][torch.as_tensor(rows)]
        for side, rows in (("chosen", chosen), ("rejected", rejected))
        for key in SIDE_KEYS
    }
    return DataProto.from_dict({**tensors, "weight": torch.ones(len(chosen))})


def sequence_log_probs(token_log_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Log-prob of each whole response [B]: the sum of its token log-probs [B, R] under the mask."""
    return masked_sum(token_log_probs, response_mask, dim=-1)


def pad_for_ranks(pairs: DataProto, world_size: int) -> DataProto:
    """Append copies of the first pairs with `weight` 0 so that `world_size` divides the row count: the
    group's own auto-padding would repeat real pairs and count them twice in the loss."""
    padded, pad = pairs.pad_to_divisor(world_size)
    if pad:
        padded.batch["weight"][-pad:] = 0.0
    return padded
