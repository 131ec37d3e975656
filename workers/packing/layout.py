"""Packing a padded micro-batch into one row, and putting per-token outputs back in the padded layout.

A padded row is a left-padded prompt then a right-padded response (`attention_mask` marks the real
tokens; `position_ids` count them from 0). Packing keeps the real tokens only, in order, concatenated
over the rows: input_ids/position_ids [1, T] with T = the real tokens of the micro-batch, and
`cu_seq_lens` [n + 1] marking where each row's tokens start. Outputs at the packed positions go back to
[b, S] or [b, R]; padding positions get 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PackedRows:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    cu_seq_lens: torch.Tensor  # [n + 1] int32 offsets of the non-empty rows
    max_length: int  # the longest row, in tokens
    valid: torch.Tensor  # [b, S] bool: the real tokens of the padded rows
    packed_index: torch.Tensor  # [b, S] long: where each padded position lies in the packed row (-1: padding)

    @classmethod
    def from_padded(
        cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> "PackedRows":
        valid = attention_mask.bool()
        lengths = valid.sum(dim=1)
        flat = valid.flatten()
        packed_index = torch.where(
            valid, flat.long().cumsum(0).view_as(valid) - 1, torch.full_like(valid, -1, dtype=torch.long)
        )
        non_empty = lengths[lengths > 0]
        cu_seq_lens = torch.zeros(len(non_empty) + 1, dtype=torch.int32, device=input_ids.device)
        cu_seq_lens[1:] = non_empty.cumsum(0)
        return cls(
            input_ids=input_ids.flatten()[flat].unsqueeze(0),
            position_ids=position_ids.flatten()[flat].unsqueeze(0),
            cu_seq_lens=cu_seq_lens,
            max_length=int(lengths.max()) if len(lengths) else 0,
            valid=valid,
            packed_index=packed_index,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments of an HF model forward on the packed row (attention via the packed interface)."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": None,
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
            "use_cache": False,
        }

    def response_predictors(self, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For the last `response_length` padded positions: (slots [b, R] bool, index [K]).

        slots marks the response tokens that are real and whose previous position is real too (the output
        there predicts them); index holds, for those slots in row-major order, the packed position of that
        previous token.
        """
        responses = self.valid[:, -response_length:]
        previous = self.valid[:, -response_length - 1 : -1]
        slots = responses & previous
        index = self.packed_index[:, -response_length - 1 : -1][slots]
        return slots, index

    def to_padded(self, packed: torch.Tensor) -> torch.Tensor:
        """[T, ...] per packed token -> [b, S, ...] with 0 at padding."""
        out = packed.new_zeros((*self.valid.shape, *packed.shape[1:]))
        out[self.valid] = packed
        return out


def scatter_slots(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """values [K] for the True entries of slots [b, R] (row-major) -> [b, R], 0 elsewhere; keeps gradients."""
    out = values.new_zeros(slots.shape)
    return out.masked_scatter(slots, values)
