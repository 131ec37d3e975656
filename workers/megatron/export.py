"""Streaming a TP/PP/EP-split Megatron model out as whole HF tensors, on every rank (rollout sync, HF export).

For each pipeline stage in turn, each of its tensors is all-gathered over the stage's TP group (an expert's over
the expert-TP group of the EP rank that holds that expert, then broadcast over the EP group), then broadcast
from that stage to the other stages of the pipeline group, converted to HF names and yielded. Every rank runs the
same sequence of collectives, so every rank can call it, and at most one whole tensor is in flight at a time.
Full shapes come from the layout, not from the peers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.megatron.convert import gather_tp, hf_to_megatron, megatron_tensor_to_hf, split_pp
from workers.megatron.layout import GPTLayout
from workers.megatron.moe import expert_index, renumber_expert


def hf_meta_state(layout: GPTLayout) -> dict[str, torch.Tensor]:
    """Every HF tensor of the model as a meta tensor of its shape (per-expert names, as checkpoints hold them)."""
    h, hd, heads, kv = layout.hidden_size, layout.head_dim, layout.num_heads, layout.num_kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (layout.vocab_size, h)}
    shapes["model.norm.weight"] = (h,)
    if not layout.tied_embeddings:
        shapes["lm_head.weight"] = (layout.vocab_size, h)
    for i in range(layout.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
            p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
        }
        if layout.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (heads * hd,), p + "self_attn.k_proj.bias": (kv * hd,),
                       p + "self_attn.v_proj.bias": (kv * hd,)}
        if layout.qk_layernorm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
        if layout.moe is None:
            f = layout.ffn_hidden_size
            shapes |= {p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h)}
            shapes[p + "mlp.down_proj.weight"] = (h, f)
            continue
        f = layout.moe.ffn_hidden_size
        shapes[p + "mlp.gate.weight"] = (layout.moe.num_experts, h)
        for e in range(layout.moe.num_experts):
            x = f"{p}mlp.experts.{e}."
            shapes |= {x + "gate_proj.weight": (f, h), x + "up_proj.weight": (f, h), x + "down_proj.weight": (h, f)}
    return {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}


def _stage_tensors(layout: GPTLayout, pp: int) -> list[dict[str, torch.Tensor]]:
    """Per pipeline stage, its Megatron tensor names (layers numbered within the stage, experts globally) and
    shapes (meta tensors), in the order the stream exports them."""
    stages = split_pp(hf_to_megatron(hf_meta_state(layout), layout), layout, pp)
    if layout.tied_embeddings and pp > 1:
        stages[-1].pop("embedding.word_embeddings.weight")  # the last stage's copy: stage 0 exports it
    return stages


def hf_stream_specs(layout: GPTLayout, pp: int) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor `iter_hf_weights` yields, in its order (no collective): a sync's buckets
    are planned in it, so the stream fills them one after another."""
    per_stage = layout.num_layers // pp
    return [
        (hf_name, tuple(tensor.shape))
        for stage, tensors in enumerate(_stage_tensors(layout, pp))
        for name, meta in tensors.items()
        for hf_name, tensor in megatron_tensor_to_hf(name, meta, layout, layer_offset=stage * per_stage)
    ]


def _gather(shard: torch.Tensor, name: str, group: Any) -> torch.Tensor:
    size = dist.get_world_size(group)
    if size == 1:
        return shard
    pieces = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(pieces, shard.contiguous(), group=group)
    return gather_tp([{name: p} for p in pieces])[name]


def iter_hf_weights(
    stage_module: nn.Module, layout: GPTLayout, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, whole tensor in `dtype` on `device`) for the whole model. Collective over all ranks."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    tp_group, pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
    my_stage = ps.get_pipeline_model_parallel_rank()
    pp_ranks = dist.get_process_group_ranks(pp_group)
    moe = layout.moe is not None
    if moe:
        ep, ep_rank = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()
        ep_group, expert_tp_group = ps.get_expert_model_parallel_group(), ps.get_expert_tensor_parallel_group()
        ep_ranks, per_rank = dist.get_process_group_ranks(ep_group), layout.moe.num_experts // ep
    own = dict(stage_module.named_parameters())
    per_stage = layout.num_layers // pp
    for stage, tensors in enumerate(_stage_tensors(layout, pp)):
        for name, meta in tensors.items():
            expert = expert_index(name) if moe else None
            if stage != my_stage:
                whole = torch.empty(meta.shape, dtype=dtype, device=device)
            elif expert is None:
                whole = _gather(own[name].detach().to(dtype), name, tp_group)
            else:
                # An expert is split over the expert-TP group (the TP group unless its size is set apart) of the EP
                # rank that holds it, which then sends it to the other EP ranks.
                owner = expert // per_rank
                if owner == ep_rank:
                    local = renumber_expert(name, expert - owner * per_rank)
                    whole = _gather(own[local].detach().to(dtype), name, expert_tp_group)
                else:
                    whole = torch.empty(meta.shape, dtype=dtype, device=device)
                if ep > 1:
                    whole = whole.contiguous()
                    dist.broadcast(whole, src=ep_ranks[owner], group=ep_group)
            if pp > 1:
                whole = whole.contiguous()
                dist.broadcast(whole, src=pp_ranks[stage], group=pp_group)
            yield from megatron_tensor_to_hf(name, whole, layout, layer_offset=stage * per_stage)
