"""The actor's supervised (SFT) update: token-level negative log-likelihood of the responses.

The batch is rollout-shaped (`input_ids`, `attention_mask`, `position_ids`, `responses`, `response_mask`)
plus an optional `loss_mask` [B, R] (or [B], one value per row): only response tokens with both masks set
are trained on, so a driver can pad the batch for the ranks with rows of `loss_mask` 0. It runs through the
same epochs x mini-batches x micro-batches schedule as the PPO update (`actor.ppo_epochs`, `ppo_mini_batch_size`,
`ppo_micro_batch_size_per_gpu`, `grad_clip`, `loss_agg_mode`) and reports `sft_loss` (the NLL per
`loss_agg_mode` unit), `grad_norm` and `lr`, averaged like the PPO metrics.
"""

from __future__ import annotations

import torch

from protocol import DataProto
from workers.rl_math.losses import agg_loss

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def with_loss_mask(data: DataProto) -> DataProto:
    """`response_mask` narrowed to the tokens to train on (`loss_mask`, when given): the update schedule
    weights micro-batches by this mask, and the loss reads it."""
    if "loss_mask" not in data.batch.keys():
        return data
    mask, loss_mask = data.batch["response_mask"], data.batch["loss_mask"]
    trained = mask * (loss_mask[:, None] if loss_mask.ndim == 1 else loss_mask).to(mask.dtype)
    out = DataProto.from_dict(
        {k: data.batch[k] for k in SFT_KEYS if k != "response_mask"}, meta_info=dict(data.meta_info)
    )
    out.batch["response_mask"] = trained
    return out


def sft_loss_from_log_probs(
    log_probs: torch.Tensor, micro: DataProto, device: torch.device, loss_agg_mode: str
) -> tuple[torch.Tensor, dict[str, float]]:
    """NLL of the masked response tokens [b, R], aggregated with `loss_agg_mode` (any backend gives the log-probs)."""
    nll = agg_loss(-log_probs, micro.batch["response_mask"].to(device), loss_agg_mode)
    return nll, {"sft_loss": float(nll.detach())}
