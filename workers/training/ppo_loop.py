"""The PPO update schedule of the actor and the critic on any `TrainBackend`: epochs x mini-batches x
micro-batches.

Gradients of the micro-batches of one mini-batch are accumulated, then one clipped optimizer step is
taken. Each micro-batch loss is weighted by its share of the aggregation units (tokens for "token-mean",
non-empty sequences for the "seq-mean-*" modes) of the whole mini-batch over all data-parallel ranks, so
accumulating over micro-batches and averaging over ranks gives the gradient of one pass over the global
mini-batch, whatever the micro-batches hold: a fixed row count or a token budget (`use_dynamic_bsz`).

With Ulysses sequence parallelism (k ranks share each row, `workers/packing/ulysses.py`) the same weights
hold: the k ranks of a group count the same units (`DataParallel.copies` = k counts them once) and compute the
same loss, whose gradient their gather's backward sums over the group (k x one loss), which FSDP's average over
all dp x k ranks divides by k again. On Megatron the units are summed over its data-parallel group and
the metrics exist on the last pipeline stage, reduced over that group by the same rules.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from protocol import DataProto
from workers.cached_blocks import release_cached_blocks
from workers.config import mini_batch_per_rank
from workers.rl_math.gmpo import GMPO_AGG_MODE
from workers.rl_math.rollout_correction import EXTREME_METRICS
from workers.training.backend import (
    MicroLoss,
    ResponseForward,
    ResponseOutputs,
    TrainBackend,
)
from workers.training.batch_keys import response_mask
from workers.training.dist_utils import check_same_length, reduce_over_ranks
from workers.training.micro_batching import MicroBatching


@dataclass(frozen=True)
class PPOSchedule:
    """Epochs x mini-batches x micro-batches of one update call, and its clipping and loss aggregation."""

    epochs: int
    mini_batch_size: int  # per rank
    micro_batch_size: int
    grad_clip: float
    loss_agg_mode: str
    shuffle: bool
    seed: int
    max_token_len: int | None = None  # token budget per micro-batch (use_dynamic_bsz); None: micro_batch_size rows
    budget_setting: str = "ppo_max_token_len_per_gpu"

    @classmethod
    def from_config(
        cls,
        cfg: dict[str, Any],
        responses_per_prompt: int,
        ranks: int,
        where: str,
        seed: int,
        update_calls: int,
        sequence_parallel: int = 1,
    ) -> "PPOSchedule":
        """From an actor/critic section; the global mini-batch is split over `ranks` data-parallel ranks and
        each call shuffles with its own seed. With `sequence_parallel` ranks sharing each micro-batch the
        per-GPU token budget is multiplied by it."""
        setting = "ppo_max_token_len_per_gpu"
        budget = MicroBatching.for_call({}, 1, True, cfg[setting], setting, sequence_parallel)
        return cls(
            epochs=cfg["ppo_epochs"],
            mini_batch_size=mini_batch_per_rank(cfg, responses_per_prompt, ranks, where),
            micro_batch_size=cfg["ppo_micro_batch_size_per_gpu"],
            grad_clip=cfg["grad_clip"],
            loss_agg_mode=_units_mode(cfg),
            shuffle=cfg["shuffle"],
            seed=seed + update_calls * cfg["ppo_epochs"],
            max_token_len=budget.max_tokens if cfg["use_dynamic_bsz"] else None,
            budget_setting=budget.setting,
        )

    def micro_batching(self) -> MicroBatching:
        return MicroBatching(self.micro_batch_size, self.max_token_len, self.budget_setting)


def check_one_optimizer_step(schedule: PPOSchedule, rows: int) -> None:
    """An update without `old_log_probs` takes pi_old from its own forward, which is right only when it makes
    one optimizer step over the batch; ValueError otherwise."""
    if schedule.epochs == 1 and rows <= schedule.mini_batch_size:
        return
    raise ValueError(
        f"update_actor got a batch without old_log_probs, but it makes {schedule.epochs} epoch(s) over "
        f"{-(-rows // schedule.mini_batch_size)} mini-batch(es) of {schedule.mini_batch_size} rows per rank "
        f"({rows} rows "
        "here): after the first optimizer step its own forward no longer gives pi_old. Add the actor's "
        "compute_log_prob output to the batch first, or make one optimizer step per batch (ppo_epochs=1 and "
        "ppo_mini_batch_size = data.train_batch_size)"
    )


def _units_mode(cfg: dict[str, Any]) -> str:
    """The aggregation the policy loss really uses: GMPO's is per response whatever loss_agg_mode says."""
    if (cfg.get("policy_loss") or {}).get("loss_mode") == "geo_mean":
        return GMPO_AGG_MODE
    return cfg["loss_agg_mode"]


def loss_units(mask: torch.Tensor, loss_agg_mode: str) -> float:
    """How many units `agg_loss` averages over in a batch with this response mask."""
    if loss_agg_mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(dim=-1) > 0).sum())


def shuffled(data: DataProto, shuffle: bool, seed: int) -> DataProto:
    if not shuffle:
        return data
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return data[order]


def run_ppo_updates(
    backend: TrainBackend,
    data: DataProto,
    forward: ResponseForward,
    loss_fn: MicroLoss,
    schedule: PPOSchedule,
    method: str,
) -> dict[str, float]:
    """Run the updates and return metrics averaged over micro-batches (grad_norm over steps) and data-parallel
    ranks ({} on a rank that holds no outputs: Megatron's earlier pipeline stages).

    Every rank holds the same number of rows (checked), hence runs the same number of forward/backward
    passes and optimizer steps, which the backends' collectives need. The LR scheduler steps once per call.
    """
    check_same_length(len(data), backend.device, method)
    collected: dict[str, list[float]] = defaultdict(list)
    lr = backend.current_lr()
    batching = schedule.micro_batching()
    data_parallel = backend.data_parallel()
    releases = 0  # times the allocator's free blocks went back to the device (after micro-batches, after the phase)
    for epoch in range(schedule.epochs):
        for mini in shuffled(data, schedule.shuffle, schedule.seed + epoch).split(schedule.mini_batch_size):
            micros, _ = backend.micro_batches(mini, batching)
            units = {id(m): loss_units(response_mask(m), schedule.loss_agg_mode) for m in micros}
            total = data_parallel.total(sum(units.values()), backend.device)  # the gradient is averaged over dp

            def weighted(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
                loss, metrics = loss_fn(outputs, micro)
                share = units[id(micro)] * data_parallel.size / total if total > 0 else len(micro) / len(mini)
                return loss * share, metrics

            backend.zero_grad()
            results = backend.forward_backward(micros, forward, weighted)
            releases += results.cached_block_releases
            for metrics in results.kept:
                for key, value in metrics.items():
                    collected[key].append(value)
            collected["grad_norm"].append(backend.optimizer_step(schedule.grad_clip))
    releases += release_cached_blocks(backend.device)  # the phase is over: whatever the release point
    backend.lr_scheduler_step()
    if not backend.reports_outputs():
        return {}
    reduced = {key: _over_micro_batches(key, values) for key, values in collected.items()}
    reduced["lr"] = lr
    reduced["cached_block_releases"] = float(releases)
    return reduce_over_ranks(reduced, backend.device, EXTREME_METRICS, data_parallel.group)


def _over_micro_batches(key: str, values: list[float]) -> float:
    extreme = EXTREME_METRICS.get(key)
    if extreme is not None:
        return max(values) if extreme == "max" else min(values)
    return sum(values) / len(values)
