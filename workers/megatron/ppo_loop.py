"""The PPO update schedule (epochs x mini-batches x micro-batches) on a `MegatronEngine`.

Same weighting as `workers/fsdp/ppo_loop.py`: each micro-batch loss is scaled by its share of the
aggregation units of the mini-batch over all data-parallel ranks (Megatron's DDP averages gradients over
them), gradients accumulate through Megatron's pipeline schedule, then one clipped optimizer step per
mini-batch. Metrics exist on the last pipeline stage only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from protocol import DataProto
from workers.fsdp.micro_batching import sum_over_ranks
from workers.fsdp.ppo_loop import PPOSchedule, loss_units, shuffled
from workers.fsdp.sequences import response_mask
from workers.megatron.engine import MegatronEngine, StageLossFn

def run_ppo_updates(engine: MegatronEngine, data: DataProto, loss_fn: StageLossFn, schedule: PPOSchedule) -> dict[str, Any]:
    """Metrics averaged over micro-batches (grad_norm over steps) plus lr, on the last stage; {} elsewhere.
    The LR schedule advances once per call."""
    from megatron.core import parallel_state as ps

    collected: dict[str, list[float]] = defaultdict(list)
    lr = engine.current_lr()
    dp_group = ps.get_data_parallel_group()
    dp_size = dist.get_world_size(dp_group)
    for epoch in range(schedule.epochs):
        for mini in shuffled(data, schedule.shuffle, schedule.seed + epoch).split(schedule.mini_batch_size):
            micros = list(mini.split(schedule.micro_batch_size))
            units = {id(m): loss_units(response_mask(m), schedule.loss_agg_mode) for m in micros}
            total = sum_over_ranks(sum(units.values()), engine.device, dp_group)

            def weighted(output: torch.Tensor, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
                loss, metrics = loss_fn(output, micro)
                return loss * (units[id(micro)] * dp_size / total if total > 0 else len(micro) / len(mini)), metrics

            engine.zero_grad()
            for metrics in engine.run_micro_batches(micros, weighted, forward_only=False):
                for key, value in metrics.items():
                    collected[key].append(value)
            collected["grad_norm"].append(engine.optimizer_step(schedule.grad_clip))
    engine.lr_scheduler_step()
    if not engine.is_last_stage():
        return {}
    return {**{key: sum(values) / len(values) for key, values in collected.items()}, "lr": lr}
