"""Shaping generated tokens into the fixed-size rollout batch every engine returns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from protocol import DataProto


def response_mask_from_eos(responses: torch.Tensor, eos_token_ids: tuple[int, ...]) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (int64 [B, R])."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device)).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def pad_token_lists(
    rows: Sequence[Sequence[float]], length: int, pad_token_id: float, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Right-pad (and cut) variable-length token lists (or per-token values) into a [B, length] tensor."""
    out = torch.full((len(rows), length), pad_token_id, dtype=dtype)
    for i, row in enumerate(rows):
        row = list(row)[:length]
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def assemble_rollout(
    prompts: dict[str, torch.Tensor], generated: torch.Tensor, params, lengths: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Left-padded prompts + generated tokens [B, <=R] -> prompts, responses [B, R] (pad after the first
    EOS), input_ids / attention_mask / position_ids [B, P+R] and response_mask [B, R].

    `params` provides response_length, eos_token_ids, pad_token_id and ignore_eos (`SamplingParams`).
    `lengths` [B] says how many tokens each row generated (default: all of `generated`'s columns): with
    ignore_eos a response is every one of them, EOS included; otherwise a response ends at its first EOS or
    at its length, whichever comes first (a response stopped short of R without an EOS: a forced length)."""
    input_ids = prompts["input_ids"]
    batch, length = input_ids.shape[0], params.response_length
    generated = generated[:, :length].to(input_ids.device, input_ids.dtype)
    responses = torch.full((batch, length), params.pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    responses[:, : generated.shape[1]] = generated
    if lengths is None:
        lengths = torch.full((batch,), generated.shape[1])
    lengths = lengths.clamp(max=length).to(input_ids.device)
    mask = (torch.arange(length, device=input_ids.device) < lengths[:, None]).long()  # the first lengths[i] tokens
    if not params.ignore_eos:
        mask = mask * response_mask_from_eos(responses, params.eos_token_ids)
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, params.pad_token_id))
    return rollout_tensors(prompts, responses, mask, mask)


def rollout_tensors(
    prompts: dict[str, torch.Tensor], responses: torch.Tensor, attention: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Left-padded prompts joined with their responses [B, R]: `attention` [B, R] extends the attention mask,
    `response_mask` marks the model's tokens; the responses' positions continue the prompts'."""
    input_ids, attention_mask, position_ids = prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"]
    offsets = torch.arange(1, responses.shape[1] + 1, dtype=position_ids.dtype, device=position_ids.device)
    return {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=1),
        "attention_mask": torch.cat([attention_mask, attention.to(attention_mask.dtype)], dim=1),
        "position_ids": torch.cat([position_ids, position_ids[:, -1:] + offsets], dim=1),
        "response_mask": response_mask,
    }


def sampled_rollout(
    prompts: dict[str, torch.Tensor], tokens: list[list[int]], log_probs: list[list[float]], params
) -> dict[str, torch.Tensor]:
    """`assemble_rollout` of each row's sampled tokens, plus `rollout_log_probs` [B, R] (the engine's log-prob of
    each response token, 0 after the response)."""
    generated = pad_token_lists(tokens, params.response_length, params.pad_token_id)
    batch = assemble_rollout(prompts, generated, params, torch.tensor([len(t) for t in tokens]))
    rollout_lp = pad_token_lists(log_probs, params.response_length, 0.0, torch.float32)
    batch["rollout_log_probs"] = rollout_lp * batch["response_mask"]
    return batch


def rollout_output(prompts: DataProto, result: dict[str, torch.Tensor]) -> DataProto:
    """The engine's tensors plus every other key of the input batch (uids, ground truth, ...)."""
    from protocol import DataProto

    generated = DataProto.from_dict({k: v.cpu() for k, v in result.items()})
    carried = prompts.select(batch_keys=[k for k in prompts.batch.keys() if k not in result])
    return carried.union(generated)
