"""The critic's forward and clipped value loss on one micro-batch, on any `TrainBackend`."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from workers.rl_math.losses import compute_value_loss
from workers.rl_math.masked import masked_mean
from workers.training.backend import ResponseForward, ResponseOutputs
from workers.training.batch_keys import response_mask

VALUE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
UPDATE_KEYS = (*VALUE_KEYS, "values", "returns")
VALUE_FORWARD = ResponseForward("values")


def masked_values(outputs: ResponseOutputs, micro: DataProto) -> dict[str, torch.Tensor]:
    """`values` [b, R] on the CPU: the value of the state before each response token, 0 outside the response."""
    values = outputs.values.cpu()
    return {"values": values * response_mask(micro).to(values.dtype)}


def value_loss(
    outputs: ResponseOutputs, micro: DataProto, critic_cfg: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss toward `returns` (critic.cliprange_value, loss_agg_mode) and its metrics."""
    device = outputs.device
    mask = response_mask(micro).to(device)
    vpreds = outputs.values
    loss, clipfrac = compute_value_loss(
        vpreds,
        micro.batch["values"].to(device),
        micro.batch["returns"].to(device),
        mask,
        cliprange_value=critic_cfg["cliprange_value"],
        loss_agg_mode=critic_cfg["loss_agg_mode"],
    )
    metrics = {
        "vf_loss": float(loss.detach()),
        "vf_clipfrac": float(clipfrac),
        "vpred_mean": float(masked_mean(vpreds.detach(), mask)),
    }
    return loss, metrics
