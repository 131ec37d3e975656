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

from protocol import DataProto
from workers.rl_math.dpo import dpo_loss
from workers.rl_math.masked import masked_sum
from workers.training.backend import ResponseForward, ResponseOutputs, TrainBackend
from workers.training.dist_utils import check_same_length

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


def stacked_sides(pairs: DataProto) -> DataProto:
    """The chosen rows over the rejected rows, one sequence per row, so one forward scores both sides."""
    return DataProto.from_dict({k: torch.cat([pairs.batch[f"{s}_{k}"] for s in PAIR_SIDES]) for k in SIDE_KEYS})


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


def run_dpo_update(
    backend: TrainBackend,
    pairs: DataProto,
    settings: DPOSettings,
    *,
    micro_batch_size: int,
    grad_clip: float,
    temperature: float,
) -> dict[str, float]:
    """`settings.epochs` full-batch optimizer steps on the pairs of all data-parallel ranks; returns weighted
    means over all real pairs (measured before the first step), their count, grad_norm and lr ({} on a rank
    that holds no outputs). The LR scheduler steps once."""
    check_same_length(len(pairs), backend.device, "update_actor_dpo")
    data_parallel = backend.data_parallel()
    total = data_parallel.total(float(pairs.batch["weight"].float().sum()), backend.device)
    if total <= 0:
        raise ValueError("update_actor_dpo got no pair with weight > 0")
    denominator = float(settings.loss_denominator or total)
    pair_micros = list(pairs.split(micro_batch_size))
    micros = [stacked_sides(pair) for pair in pair_micros]
    pair_of = {id(both): pair for both, pair in zip(micros, pair_micros)}

    def loss_fn(outputs: ResponseOutputs, both: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        pair = pair_of[id(both)]
        sequence = masked_sum(outputs.log_probs, both.batch["response_mask"].to(outputs.device), dim=-1)
        loss, weighted = weighted_pair_loss(sequence[: len(pair)], sequence[len(pair) :], pair, settings)
        # The backend averages gradients over the data-parallel ranks: x their count makes it the sum over all
        # pairs (a Ulysses group's k ranks sum one loss's gradient k times, which FSDP's average divides back).
        return loss * (data_parallel.size / denominator), weighted

    forward = ResponseForward("log_probs", temperature)
    sums: dict[str, float] = defaultdict(float)
    grad_norms, lr = [], backend.current_lr()
    for epoch in range(settings.epochs):
        backend.zero_grad()
        results = backend.forward_backward(micros, forward, loss_fn)
        if epoch == 0:
            for metrics in results.kept:
                for name, value in metrics.items():
                    sums[name] += value
        grad_norms.append(backend.optimizer_step(grad_clip))
    backend.lr_scheduler_step()
    if not backend.reports_outputs():
        return {}
    keys = sorted(sums)
    summed = data_parallel.totals([sums[k] for k in keys], backend.device)
    metrics = {k: v / total for k, v in zip(keys, summed)}
    return {**metrics, "grad_norm": sum(grad_norms) / len(grad_norms), "lr": lr, "pairs": total}
