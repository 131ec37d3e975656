"""Routing replay (`actor.router_replay.mode` R2 / R3: workers/routing_replay/passes.py) on megatron-core's MoE layers.

Each `TopKRouter` asks its `router_replay` object for the top-k experts of the tokens it routes
(`get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)`, megatron-core 0.16 to 0.19); this
module puts its own object there, so a replayed choice keeps the live router's weights (the chosen experts' scores
gathered from the live logits: the router still gets a gradient), positions without a recorded choice route live,
and every comparison is counted.

Token order: a router sees the hidden states [S/tp, b] of its pipeline stage's layers (sequence-first, the padded
sequence split over the TP ranks under sequence parallelism), flattened S-major. The batch's table is
[b, S, layers, k] over the padded positions of `input_ids`. The layers are counted over the whole model
(`router.layer_number` - 1), so each stage reads its own columns.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from protocol import DataProto
from workers.routing_replay.hooks import NOT_RECORDED, Mismatch
from workers.routing_replay.passes import PassMode, PassRouting
from workers.routing_replay.token_order import ROUTED_EXPERTS

TopK = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # megatron's (scores, topk, num_groups, group_topk)


@dataclass(frozen=True)
class SequenceSplit:
    """How one micro-batch's padded positions reach this rank's routers."""

    valid: torch.Tensor  # [b, S] bool: the real tokens
    padded: int  # the forward's sequence length (S rounded up for sequence parallelism)
    tp_size: int  # sequence parallel: the TP ranks split the padded sequence (1: every rank routes all of it)
    tp_rank: int

    def to_forward(self, table: torch.Tensor) -> torch.Tensor:
        """[b, S, layers, k] -> [tokens this rank routes (S-major), layers, k] long."""
        length = self.valid.shape[1]
        table = table.long()
        if self.padded != length:
            table = nn.functional.pad(table, (0, 0, 0, 0, 0, self.padded - length), value=NOT_RECORDED)
        width = self.padded // self.tp_size
        local = table.transpose(0, 1)[self.tp_rank * width : (self.tp_rank + 1) * width]
        return local.flatten(0, 1)

    def to_positions(self, routed: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        """`to_forward`'s inverse for what this rank's routers chose ([tokens, layers, k]): [b, S, layers, k] long,
        `NOT_RECORDED` at padding (a collective over the TP `group` under sequence parallelism)."""
        rows, length = self.valid.shape
        local = routed.view(-1, rows, *routed.shape[1:])
        if self.tp_size > 1:
            shards = [torch.empty_like(local) for _ in range(self.tp_size)]
            dist.all_gather(shards, local.contiguous(), group=group)
            local = torch.cat(shards)
        table = local.transpose(0, 1)[:, :length].clone()
        table[~self.valid.to(table.device)] = NOT_RECORDED
        return table


class _LayerReplay:
    """One router's `router_replay`: megatron-core calls `get_replay_topk` for the top-k of every forward."""

    def __init__(self, routing: MegatronRouting, layer: int) -> None:
        self.routing = routing
        self.layer = layer
        self.layer_number = layer + 1  # megatron-core 0.19 writes it when the layer number is set

    def get_replay_topk(
        self, scores: torch.Tensor, topk: int, num_groups: int | None = None, group_topk: int | None = None,
        default_compute_topk: TopK | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values, live = default_compute_topk(scores, topk, num_groups, group_topk)
        return self.routing.choose(self.layer, scores, values, live)


class MegatronRouting(PassRouting):
    """Routing replay on the `TopKRouter`s of one pipeline stage of a megatron-core GPT model."""

    def __init__(
        self, model: nn.Module, num_layers: int, sequence_parallel: bool, device: torch.device, recompute: bool
    ) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.moe.router import TopKRouter

        super().__init__()
        self.num_layers = num_layers
        self.device = device
        self.layers: list[int] = []
        for router in model.modules():
            if isinstance(router, TopKRouter):
                layer = router.layer_number - 1  # counted over the whole model, from 1
                router.router_replay = _LayerReplay(self, layer)
                self.layers.append(layer)
        self.layers.sort()
        self.tp_size = ps.get_tensor_model_parallel_world_size() if sequence_parallel else 1
        self.tp_rank = ps.get_tensor_model_parallel_rank() if sequence_parallel else 0
        self.tp_group = ps.get_tensor_model_parallel_group() if sequence_parallel else None
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.model_parallel_group = ps.get_model_parallel_group()
        self.mismatch = Mismatch.zero()
        self._table: torch.Tensor | None = None  # replay / compare: [tokens, layers, k] of the micro-batch running
        # Recomputed layers (model.enable_gradient_checkpointing) route again in the backward, outside the forward's
        # context, micro-batch after micro-batch in the order of their forwards: per layer, the columns to replay.
        self.recompute = recompute
        self._in_backward: dict[int, deque[torch.Tensor]] = defaultdict(deque)
        self._keep_for_backward = False
        self._recorded: dict[int, torch.Tensor] = {}  # record: this micro-batch's choices per layer
        self._recordings: list[tuple[SequenceSplit, dict[int, torch.Tensor]]] = []

    # ---- one micro-batch's forward ---------------------------------------------------------------------
    @contextmanager
    def micro_batch(self, micro: DataProto, padded: int, backward: bool) -> Iterator[None]:
        """Around the forward of `micro`, run on `padded` positions (`backward`: a training forward, whose recomputed
        layers route again in its backward)."""
        if self.mode is None:
            yield
            return
        split = SequenceSplit(micro.batch["attention_mask"].bool(), padded, self.tp_size, self.tp_rank)
        if self.mode == "record":
            self._recorded = {}
            yield
            self._recordings.append((split, self._recorded))
            return
        self._table = split.to_forward(micro.batch[ROUTED_EXPERTS].to(self.device))
        self._keep_for_backward = self.recompute and backward
        try:
            yield
        finally:
            self._table = None

    def choose(
        self, layer: int, scores: torch.Tensor, values: torch.Tensor, live: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (scores, experts) a router of `layer` goes on with, given its live top-k."""
        if self.mode == "record":
            self._recorded[layer] = live.detach()
        if self.mode not in ("replay", "compare"):
            return values, live
        if self._table is None:  # a recomputed layer in the backward: the choice its forward replayed
            if not self._in_backward[layer]:
                raise RuntimeError(f"routing replay: the router of layer {layer} ran again with no forward pending")
            chosen = self._in_backward[layer].popleft()
            return scores.gather(1, chosen), chosen
        table = self._table
        if table.shape[0] != live.shape[0] or table.shape[2] != live.shape[1]:
            raise RuntimeError(
                f"routing replay: the router of layer {layer} chose {tuple(live.shape)} (tokens, experts per token) "
                f"but the recorded routing for this forward is {tuple(table.shape)} (tokens, layers, experts per "
                "token): the recorded routing does not belong to these tokens"
            )
        chosen = self.mismatch.count(table[:, layer], live)
        if self.mode == "compare":
            return values, live
        if self._keep_for_backward:  # (megatron-core runs a recomputed layer's forward without autograd)
            self._in_backward[layer].append(chosen)
        return scores.gather(1, chosen), chosen

    @contextmanager
    def pass_mode(self, mode: PassMode | None, data: DataProto, method: str) -> Iterator[None]:
        try:
            with super().pass_mode(mode, data, method):
                yield
        finally:
            self._in_backward.clear()  # every backward has run (or the pass failed)

    # ---- after a pass ----------------------------------------------------------------------------------
    def recorded_tables(self) -> list[torch.Tensor]:
        """The recording pass's choices per micro-batch, [b, S, layers, k] int16 on the CPU, every layer's on every
        rank (collectives over the TP group under sequence parallelism and over the pipeline stages)."""
        tables = []
        for split, per_layer in self._recordings:
            if sorted(per_layer) != self.layers:
                raise RuntimeError(
                    f"routing replay: a recorded forward routed layers {sorted(per_layer)}, expected {self.layers}"
                )
            local = split.to_positions(torch.stack([per_layer[layer] for layer in self.layers], dim=1), self.tp_group)
            # Each stage fills its layers' columns; a sum over the stages (of value + 1, 0 elsewhere) joins them.
            table = local.new_zeros((*local.shape[:2], self.num_layers, local.shape[-1]), dtype=torch.int32)
            table[:, :, self.layers] = (local + 1).to(torch.int32)
            if dist.get_world_size(self.pp_group) > 1:
                dist.all_reduce(table, group=self.pp_group)
            tables.append((table - 1).to(torch.int16).cpu())
        self._recordings = []
        return tables

    def mismatch_share(self) -> float | None:
        """Summed over the model-parallel ranks: the stages count their own layers, the TP ranks their own tokens
        under sequence parallelism (without it each counts the same, which leaves the share as it is)."""
        counts = torch.stack([self.mismatch.compared.to(self.device), self.mismatch.differ.to(self.device)]).double()
        self.mismatch = Mismatch.zero()
        if dist.get_world_size(self.model_parallel_group) > 1:
            dist.all_reduce(counts, group=self.model_parallel_group)
        compared, differ = counts.tolist()
        return None if compared == 0 else differ / compared
