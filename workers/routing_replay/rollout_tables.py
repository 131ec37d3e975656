"""The rollout's expert choices as the batch's routing table: int16 [B, P+R, layers, k] over the padded
positions of `input_ids` (left-padded prompt, right-padded response), `NOT_RECORDED` where no forward routed a
token (padding, and a response's last token, which the engine sampled but never ran)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workers.routing_replay.hooks import NOT_RECORDED


def _calls_by_row(calls: Sequence[torch.Tensor], batch: int) -> torch.Tensor:
    """HF generate's router calls (each [batch x positions, layers, k], row by row) -> [batch, positions, layers, k]."""
    return torch.cat([call.reshape(batch, -1, *call.shape[1:]) for call in calls], dim=1)


def generation_table(calls: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
    """HF generate's router calls (the prefill of the padded prompts [B x P tokens], then one decode step of B
    tokens after another; each [tokens, layers, k]) -> the table over `attention_mask` [B, P+R]."""
    batch, width = attention_mask.shape
    per_row = _calls_by_row(calls, batch)
    table = per_row.new_full((batch, width, *per_row.shape[2:]), NOT_RECORDED)
    routed = min(width, per_row.shape[1])
    table[:, :routed] = per_row[:, :routed]
    table[~attention_mask.bool().to(table.device)] = NOT_RECORDED
    return table.to(torch.int16).cpu()


def generation_rows(
    calls: Sequence[torch.Tensor], context_lengths: Sequence[int], sampled_lengths: Sequence[int]
) -> list[torch.Tensor]:
    """HF generate's router calls over left-padded contexts (a prefill of B x max(context) tokens, then one decode
    step of B tokens after another) -> per row, the experts of the tokens it ran in order: its context and its
    sampled tokens but the last ([context + sampled - 1, layers, k], as vLLM returns a request's)."""
    width = max(context_lengths)
    per_row = _calls_by_row(calls, len(context_lengths))
    return [
        per_row[row, width - context : width + sampled - 1].to(torch.int16).cpu()
        for row, (context, sampled) in enumerate(zip(context_lengths, sampled_lengths))
    ]


def engine_table(routed: Sequence[Any], prompt_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """vLLM's `routed_experts` of each request ([its prompt tokens + its response tokens - 1, layers, k]: every
    token the engine ran, in order) -> the table over the left-padded prompts `prompt_mask` [B, P] and
    `response_length` response columns."""
    missing = [i for i, row in enumerate(routed) if row is None]
    if missing:
        raise RuntimeError(
            f"vLLM returned no expert choices for {len(missing)} of {len(routed)} responses (rows {missing[:5]}): the "
            "engine was started without enable_return_routed_experts"
        )
    rows = [torch.as_tensor(row).long() for row in routed]
    batch, prompt_width = prompt_mask.shape
    width = prompt_width + response_length
    table = torch.full((batch, width, *rows[0].shape[1:]), NOT_RECORDED, dtype=torch.long)
    for i, (row, prompt_tokens) in enumerate(zip(rows, prompt_mask.sum(dim=1).tolist())):
        start = prompt_width - int(prompt_tokens)  # the row's real tokens run contiguously from here
        count = min(row.shape[0], width - start)
        table[i, start : start + count] = row[:count]
    return table.to(torch.int16)
