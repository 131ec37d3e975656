"""The GPT model's forward over padded rows [b, S] as the Megatron backend and the strategy API run it: the padded
width under sequence parallelism, the left padding every row shares, the attention mask, and the routers' padding
mask."""

from __future__ import annotations

import torch
from torch import nn

from protocol import DataProto
from workers.megatron.model import ParallelSettings


def padded_length(length: int, settings: ParallelSettings) -> int:
    """`length` rounded up to a multiple of the TP size under sequence parallelism (it splits the sequence over
    the TP ranks)."""
    multiple = settings.tp if settings.sequence_parallel else 1
    return -(-length // multiple) * multiple


def common_left_padding(micros: list[DataProto]) -> int:
    """Leading columns that are padding in every row of every micro-batch: left-padded prompts (padded to
    data.max_prompt_length) leave many, which no real token attends to."""
    columns = [m.batch["attention_mask"].bool().any(dim=0) for m in micros]
    firsts = [int(real.int().argmax()) if bool(real.any()) else real.numel() for real in columns]
    return min(firsts)


def sequence_forward(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: ParallelSettings,
    device: torch.device, router_padding: bool = False,
) -> torch.Tensor:
    """The GPT model's forward over rows [b, S] (1 = token in `attention_mask`), padded on the right to
    `padded_length` (the output keeps the padded positions; the caller cuts them off). With `router_padding` the MoE
    routers' losses leave the padding out. Also the strategy API's."""
    length = input_ids.shape[1]
    padded = padded_length(length, settings)
    ids, mask = input_ids.to(device), attention_mask.to(device)
    if padded != length:
        ids, mask = nn.functional.pad(ids, (0, padded - length)), nn.functional.pad(mask, (0, padded - length))
    positions = torch.arange(padded, device=device).expand_as(ids)
    # [b, 1, S, S] True = masked: causal, and no attention to padding. Rows of left-padded prompts start at
    # position > 0; RoPE scores depend only on relative positions, so the real tokens see what they see in the
    # HF model with its shifted position ids.
    causal = torch.ones(padded, padded, dtype=torch.bool, device=device).triu(1)
    attention = causal[None, None] | ~mask.bool()[:, None, None, :]
    if not router_padding:
        return model(ids, positions, attention)
    return model(ids, positions, attention, padding_mask=stage_padding_mask(mask, settings))


def stage_padding_mask(mask: torch.Tensor, settings: ParallelSettings) -> torch.Tensor:
    """megatron-core's `padding_mask` for the routers' losses (True = padding, [b, S]). Under sequence parallelism
    the first pipeline stage scatters it over the TP ranks as it does the embeddings; later stages get this rank's
    part of the sequence already (megatron-core scatters it only where the embedding runs)."""
    from megatron.core import parallel_state as ps

    padding = ~mask.bool()
    if not settings.sequence_parallel or ps.is_pipeline_first_stage():
        return padding
    return padding.chunk(settings.tp, dim=1)[ps.get_tensor_model_parallel_rank()].contiguous()
