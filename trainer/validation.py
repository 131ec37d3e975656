"""Greedy validation of the actor with the rule reward (the trainer's `val/` metrics)."""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol import DataProto


def validate(generator: Any, val_batches: list[DataProto], reward_fn: Any) -> dict[str, float]:
    """`val/reward_mean` and `val/<data_source>/reward_mean` of greedy responses; {} without batches.
    `generator` has `generate_sequences(DataProto)` (the run's `RoleGroups`, or a worker group)."""
    scores, sources = [], []
    for batch in val_batches:
        batch = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"], non_tensor_batch_keys=list(batch.non_tensor_batch))
        batch.meta_info.update(do_sample=False)
        out = generator.generate_sequences(batch)
        scores.append(reward_fn(out)[0].sum(-1).numpy())
        sources.extend(out.non_tensor_batch["data_source"])
    if not scores:
        return {}
    all_scores, sources_arr = np.concatenate(scores), np.asarray(sources)
    metrics = {"val/reward_mean": float(all_scores.mean())}
    for source in sorted(set(sources)):
        metrics[f"val/{source}/reward_mean"] = float(all_scores[sources_arr == source].mean())
    return metrics
