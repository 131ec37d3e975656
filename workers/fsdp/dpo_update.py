"""The actor's DPO update on a batch of preference pairs, packed one pair per row.

A pair row holds the chosen and the rejected sequence side by side (`chosen_input_ids`, ...,
`rejected_response_mask`), their summed reference log-probs (`chosen_ref_logps`, `rejected_ref_logps`)
and a `weight` (1 for a real pair, 0 for a row the driver added so every rank gets the same number of
rows). One row per pair keeps a pair on one rank whatever the data-parallel split and its padding does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from protocol import DataProto
from workers.fsdp.dist_utils import check_same_length
from workers.fsdp.engine import FSDPEngine
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.rl_math.dpo import dpo_loss
from workers.rl_math.masked import masked_sum

PAIR_SIDES = ("chosen", "rejected")
SIDE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
PAIR_KEYS = (*(f"{s}_{k}" for s in PAIR_SIDES for k in SIDE_KEYS), "chosen_ref_logps", "rejected_ref_logps", "weight")


@dataclass(frozen=True)
class DPOSettings:
    """The loss and schedule of one `update_actor_dpo` call, sent by the driver in `meta_info["dpo"]`."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    epochs: int = 1  # optimizer steps on the same pairs (full batch each)
    # The loss is the weighted sum over pairs divided by this; None: the number of real pairs (their mean).
    # The recipe passes the number of prompts, so a batch where few prompts gave a pair moves the policy less.
    loss_denominator: float | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> "DPOSettings":
        meta = dict(meta or {})
        unknown = sorted(set(meta) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown DPO settings {unknown}; valid: {sorted(cls.__dataclass_fields__)}")
        settings = cls(**meta)
        if isinstance(settings.epochs, bool) or not isinstance(settings.epochs, int) or settings.epochs < 1:
            raise ValueError(f"DPO epochs must be an int >= 1, got {settings.epochs!r}")
        if settings.loss_denominator is not None and not settings.loss_denominator > 0:
            raise ValueError(f"DPO loss_denominator must be > 0 or None, got {settings.loss_denominator!r}")
        return settings


def pair_log_probs(model: nn.Module, micro: DataProto, device: torch.device, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed response log-probs [b] of the chosen and the rejected sequences, in one forward pass."""
    both = DataProto.from_dict({k: torch.cat([micro.batch[f"{s}_{k}"] for s in PAIR_SIDES]) for k in SIDE_KEYS})
    token_log_probs, _ = response_log_probs_and_entropy(model, both, device, temperature, with_entropy=False)
    sequence = masked_sum(token_log_probs, both.batch["response_mask"].to(device), dim=-1)
    return sequence[: len(micro)], sequence[len(micro) :]


def weighted_pair_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, pairs: DataProto, settings: DPOSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPO loss summed over the pairs with their `weight`s, and the weighted sums of the metrics
    (loss, accuracy, margin, rewards, log-probs), from the pairs' summed response log-probs [b]."""
    device = chosen.device
    weight = pairs.batch["weight"].to(device).float()
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        chosen, rejected, pairs.batch["chosen_ref_logps"].to(device), pairs.batch["rejected_ref_logps"].to(device),
        settings.beta, settings.loss_type, settings.label_smoothing,
    )
    metrics = {
        "loss": losses, "accuracy": (chosen_rewards > rejected_rewards).float(),
        "margin": chosen_rewards - rejected_rewards, "chosen_reward": chosen_rewards,
        "rejected_reward": rejected_rewards, "chosen_logps": chosen, "rejected_logps": rejected,
    }
    return (losses * weight).sum(), {name: float((value.detach() * weight).sum()) for name, value in metrics.items()}


def _sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def run_dpo_update(
    engine: FSDPEngine,
    pairs: DataProto,
    settings: DPOSettings,
    *,
    micro_batch_size: int,
    grad_clip: float,
    temperature: float,
    sequence_parallel: int = 1,
) -> dict[str, float]:
    """`settings.epochs` full-batch optimizer steps on the pairs of all ranks; returns weighted means over
    all real pairs (measured before the first step), their count, grad_norm and lr. The LR scheduler steps once.
    With `sequence_parallel` ranks sharing each row (Ulysses) the pairs of a group are counted once."""
    check_same_length(len(pairs), engine.device, "update_actor_dpo")
    device, world = engine.device, dist.get_world_size() if dist.is_initialized() else 1
    data_parallel = world // sequence_parallel
    total = float(_sum_over_ranks(pairs.batch["weight"].float().sum().to(device))) / sequence_parallel
    if total <= 0:
        raise ValueError("update_actor_dpo got no pair with weight > 0")
    denominator = float(settings.loss_denominator or total)
    engine.module.train()
    sums: dict[str, float] = defaultdict(float)
    grad_norms, lr = [], engine.current_lr()
    for epoch in range(settings.epochs):
        engine.zero_grad()
        for micro in pairs.split(micro_batch_size):
            chosen, rejected = pair_log_probs(engine.module, micro, device, temperature)
            loss, weighted = weighted_pair_loss(chosen, rejected, micro, settings)
            # FSDP averages gradients over all ranks, and a sequence-parallel group's k ranks sum one loss's
            # gradient k times: scaling by the data-parallel count makes that the sum over all pairs.
            (loss * (data_parallel / denominator)).backward()
            if epoch == 0:
                for name, value in weighted.items():
                    sums[name] += value
        grad_norms.append(engine.optimizer_step(grad_clip))
    engine.lr_scheduler_step()
    keys = sorted(sums)
    summed = _sum_over_ranks(torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=device))
    summed /= sequence_parallel  # each pair was counted by every rank of its sequence-parallel group
    metrics = {k: float(v) / total for k, v in zip(keys, summed.tolist())}
    return {**metrics, "grad_norm": sum(grad_norms) / len(grad_norms), "lr": lr, "pairs": total}
