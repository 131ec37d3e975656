"""Micro-batches of a forward or update pass: a fixed row count, or a token budget per micro-batch.

With a token budget (`use_dynamic_bsz`), rows are grouped so each micro-batch holds at most `max_tokens`
real tokens, with the tokens spread evenly over the micro-batches; every data-parallel rank then runs the
same number of micro-batches (FSDP's per-layer collectives need equal forward counts), the largest any
rank needs. Forward outputs come back in the rows' original order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from protocol import DataProto
from workers.packing.token_budget import groups_needed, spread
from workers.training.dist_utils import reduce_over_ranks


def row_lengths(data: DataProto) -> list[int]:
    """Real tokens (prompt + response) of each row."""
    return data.batch["attention_mask"].sum(dim=1).tolist()


@dataclass(frozen=True)
class MicroBatching:
    rows: int  # rows per micro-batch (fixed mode)
    max_tokens: int | None = None  # tokens per micro-batch (dynamic mode); None: fixed rows
    setting: str = "max_token_len"  # the config key of max_tokens, for errors

    @classmethod
    def for_call(
        cls,
        meta_info: dict[str, Any],
        rows: int,
        dynamic: bool,
        max_tokens: int,
        setting: str,
        sequence_parallel: int = 1,
    ) -> "MicroBatching":
        """The configured micro-batching, overridable per call by meta_info keys `micro_batch_size`,
        `use_dynamic_bsz` and `max_token_len`. A token budget is per GPU: with `sequence_parallel` ranks
        sharing each micro-batch (Ulysses) a micro-batch holds that many times the budget."""
        dynamic = bool(meta_info.get("use_dynamic_bsz", dynamic))
        budget = int(meta_info.get("max_token_len", max_tokens)) * sequence_parallel
        if sequence_parallel > 1:
            setting = f"{setting} x {sequence_parallel} sequence-parallel ranks"
        return cls(
            rows=int(meta_info.get("micro_batch_size", rows)), max_tokens=budget if dynamic else None, setting=setting
        )

    def split(self, data: DataProto, device: torch.device) -> tuple[list[DataProto], list[int]]:
        """(micro-batches, the row order they follow). Collective in dynamic mode: call on every rank."""
        if self.max_tokens is None:
            return list(data.split(self.rows)), list(range(len(data)))
        lengths = row_lengths(data)
        groups = 0
        while True:  # every rank agrees on the count: the largest any rank needs to fit the budget
            needed = {"groups": groups_needed(lengths, self.max_tokens, max(groups, 1), self.setting)}
            agreed = int(reduce_over_ranks(needed, device, {"groups": "max"})["groups"])
            if agreed == groups:
                break
            groups = agreed
        members = spread(lengths, groups) if lengths else []
        return [data[torch.tensor(m)] for m in members], [row for m in members for row in m]


def in_row_order(outputs: list[dict[str, torch.Tensor]], order: list[int]) -> dict[str, torch.Tensor]:
    """Per-micro-batch outputs joined, their rows put back in the batch's order (`order`: what they follow)."""
    if not outputs:
        return {}
    joined = {key: torch.cat([o[key] for o in outputs]) for key in outputs[0]}
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return {key: value[inverse] for key, value in joined.items()}
