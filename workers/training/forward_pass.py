"""A forward-only pass over a batch on any `TrainBackend`: per-row outputs back in the batch's row order."""

from __future__ import annotations

import torch

from protocol import DataProto
from workers.cached_blocks import release_cached_blocks
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.training.backend import (
    MicroKeep,
    ResponseForward,
    ResponseOutputs,
    TrainBackend,
)
from workers.training.micro_batching import MicroBatching, in_row_order


def forward_rows(
    backend: TrainBackend, data: DataProto, batching: MicroBatching, forward: ResponseForward, keep: MicroKeep
) -> dict[str, torch.Tensor] | None:
    """`keep`'s per-row tensors over every micro-batch, in `data`'s row order; None on a rank that holds no
    outputs (Megatron's earlier pipeline stages)."""
    micros, order = backend.micro_batches(data, batching)
    kept = backend.forward_only(micros, forward, keep)
    release_cached_blocks(backend.device)  # the phase is over: whatever the release point
    if not backend.reports_outputs():
        return None
    return in_row_order(kept, order)


def response_log_probs(outputs: ResponseOutputs, micro: DataProto) -> dict[str, torch.Tensor]:
    """What a log-prob pass returns per row: float32 log-probs (and entropies when computed), on the CPU."""
    kept = {"log_probs": outputs.log_probs.float().cpu()}
    if outputs.entropy is not None:
        kept["entropy"] = outputs.entropy.float().cpu()
    if outputs.routed_experts is not None:  # a recording pass of routing replay (R2)
        kept[ROUTED_EXPERTS] = outputs.routed_experts
    return kept
