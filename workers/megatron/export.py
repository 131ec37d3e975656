"""Streaming a TP/PP-split Megatron model out as whole HF tensors, on every rank (rollout sync, HF export).

For each pipeline stage in turn, each of its tensors is all-gathered over the stage's TP group, then
broadcast from that stage to the other stages of the pipeline group, converted to HF names and yielded.
Every rank runs the same sequence of collectives, so every rank can call it, and at most one whole tensor
is in flight at a time. Full shapes come from the HF config (a meta-device model), not from the peers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.megatron.convert import gather_tp, hf_to_megatron, megatron_tensor_to_hf, split_pp
from workers.megatron.layout import GPTLayout


def iter_hf_weights(
    stage_module: nn.Module, hf_config: Any, layout: GPTLayout, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, whole tensor in `dtype` on `device`) for the whole model. Collective over all ranks."""
    from megatron.core import parallel_state as ps
    from transformers import AutoModelForCausalLM

    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    tp_group, pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
    my_stage = ps.get_pipeline_model_parallel_rank()
    pp_ranks = dist.get_process_group_ranks(pp_group)
    own = dict(stage_module.named_parameters())
    per_stage = layout.num_layers // pp
    # Per pipeline stage, its Megatron tensor names (layers numbered within the stage) and whole shapes.
    with torch.device("meta"):
        state = AutoModelForCausalLM.from_config(hf_config).state_dict()
    if layout.tied_embeddings:
        state.pop("lm_head.weight", None)
    stages = split_pp(hf_to_megatron(state, layout), layout, pp)
    if layout.tied_embeddings and pp > 1:
        stages[-1].pop("embedding.word_embeddings.weight")  # the last stage's copy: stage 0 exports it
    for stage, tensors in enumerate(stages):
        for name, meta in tensors.items():
            if stage == my_stage:
                shard = own[name].detach().to(dtype)
                if tp > 1:
                    pieces = [torch.empty_like(shard) for _ in range(tp)]
                    dist.all_gather(pieces, shard.contiguous(), group=tp_group)
                    whole = gather_tp([{name: p} for p in pieces])[name]
                else:
                    whole = shard
            else:
                whole = torch.empty(meta.shape, dtype=dtype, device=device)
            if pp > 1:
                whole = whole.contiguous()
                dist.broadcast(whole, src=pp_ranks[stage], group=pp_group)
            yield from megatron_tensor_to_hf(name, whole, layout, layer_offset=stage * per_stage)
