"""Hugging Face <-> megatron-core GPT state dicts (local layer spec names), and their TP/PP splits.

Megatron fuses what HF keeps apart: `linear_qkv` holds, per key/value group, that group's query heads then
its key head then its value head; `linear_fc1` is [gate; up] (on each TP rank: that rank's gate rows, then
its up rows). Column-parallel weights (qkv, fc1, output layer, embedding rows) split along dim 0,
row-parallel ones (proj, fc2) along dim 1; norms are replicated. Pipeline stages number their layers from 0;
the first stage holds the embedding, the last the final norm and the output layer.
"""

from __future__ import annotations

import re

import torch

from workers.megatron.layout import GPTLayout
from workers.megatron.moe import hf_moe_mlp_to_megatron, megatron_moe_tensor_to_hf

State = dict[str, torch.Tensor]
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


# ---- HF <-> Megatron (whole model, TP = PP = 1) ---------------------------------------------------------
def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GPTLayout) -> torch.Tensor:
    groups, per, hd = layout.num_kv_heads, layout.heads_per_group, layout.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, per * hd, *rest)
    k = k.reshape(groups, hd, *rest)
    v = v.reshape(groups, hd, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (per + 2) * hd, *rest)


def _split_qkv(qkv: torch.Tensor, layout: GPTLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per, hd = layout.num_kv_heads, layout.heads_per_group, layout.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per + 2) * hd, *rest)
    q, k, v = torch.split(grouped, [per * hd, hd, hd], dim=1)
    return q.reshape(groups * per * hd, *rest), k.reshape(groups * hd, *rest), v.reshape(groups * hd, *rest)


def _pad_vocab(weight: torch.Tensor, layout: GPTLayout) -> torch.Tensor:
    pad = layout.padded_vocab_size - weight.shape[0]
    return torch.cat([weight, weight.new_zeros(pad, *weight.shape[1:])]) if pad else weight


def hf_to_megatron(hf: State, layout: GPTLayout) -> State:
    """Whole model, or one pipeline stage's part (layers numbered from 0; the embedding, final norm and LM
    head are converted when present)."""
    out: State = {}
    if "model.embed_tokens.weight" in hf:
        out["embedding.word_embeddings.weight"] = _pad_vocab(hf["model.embed_tokens.weight"], layout)
    for i in range(layout.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        for kind in ("weight",) + (("bias",) if layout.qkv_bias else ()):
            out[dst + f"self_attention.linear_qkv.{kind}"] = _fuse_qkv(
                *(hf[src + f"self_attn.{p}_proj.{kind}"] for p in "qkv"), layout
            )
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        if layout.qk_layernorm:
            out[dst + "self_attention.q_layernorm.weight"] = hf[src + "self_attn.q_norm.weight"]
            out[dst + "self_attention.k_layernorm.weight"] = hf[src + "self_attn.k_norm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        if layout.moe is not None:
            out.update(hf_moe_mlp_to_megatron(hf, src, dst, layout.moe))
            continue
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]]
        )
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    if "model.norm.weight" in hf:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if "lm_head.weight" in hf and not layout.tied_embeddings:
        out["output_layer.weight"] = _pad_vocab(hf["lm_head.weight"], layout)
    return out


_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def megatron_tensor_to_hf(
    name: str, tensor: torch.Tensor, layout: GPTLayout, layer_offset: int = 0
) -> list[tuple[str, torch.Tensor]]:
    """One whole (TP-gathered) Megatron tensor as its HF tensors; layer numbers are shifted by `layer_offset`
    (a pipeline stage's first layer), expert numbers are taken as global. A tied model's output layer maps to
    nothing (HF ties it)."""
    vocab = layout.vocab_size
    match = _LAYER.match(name)
    if match is None:
        if name == "embedding.word_embeddings.weight":
            return [("model.embed_tokens.weight", tensor[:vocab])]
        if name == "decoder.final_layernorm.weight":
            return [("model.norm.weight", tensor)]
        if name == "output_layer.weight":
            return [] if layout.tied_embeddings else [("lm_head.weight", tensor[:vocab])]
        raise KeyError(f"no HF name for Megatron tensor {name!r}")
    dst, rest = f"model.layers.{int(match.group(1)) + layer_offset}.", match.group(2)
    if rest in _LAYER_RENAMES:
        return [(dst + _LAYER_RENAMES[rest], tensor)]
    if rest.startswith("self_attention.linear_qkv."):
        kind = rest.rsplit(".", 1)[1]
        return [(dst + f"self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", _split_qkv(tensor, layout))]
    moe = megatron_moe_tensor_to_hf(rest, tensor, dst)
    if moe is not None:
        return moe
    if rest == "mlp.linear_fc1.weight":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(dst + "mlp.gate_proj.weight", gate), (dst + "mlp.up_proj.weight", up)]
    raise KeyError(f"no HF name for Megatron tensor {name!r}")


def megatron_to_hf(mc: State, layout: GPTLayout) -> State:
    """Inverse of `hf_to_megatron` (also per stage: parts absent from `mc` are skipped)."""
    return dict(pair for name, tensor in mc.items() for pair in megatron_tensor_to_hf(name, tensor, layout))


# ---- tensor parallel --------------------------------------------------------------------------------------
_COLUMN = (
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "embedding.word_embeddings.weight",
    "output_layer.weight",
)
# The dense MLP's and every expert's (`mlp.experts.local_experts.{j}.linear_fc*`) split the same way.
_ROW = ("self_attention.linear_proj.weight", ".linear_fc2.weight")
_FC1 = ".linear_fc1.weight"


def _tp_kind(name: str) -> str:
    if name.endswith(_FC1):
        return "fc1"
    if name.endswith(_COLUMN):
        return "column"
    if name.endswith(_ROW):
        return "row"
    return "replicated"


def shard_tp(mc: State, tp: int) -> list[State]:
    """Per TP rank, its slice of every tensor (qkv slices hold whole key/value groups: TP divides them)."""
    shards: list[State] = [{} for _ in range(tp)]
    for name, tensor in mc.items():
        kind = _tp_kind(name)
        if kind == "fc1":
            gate, up = torch.chunk(tensor, 2, dim=0)
            pieces = [torch.cat([g, u]) for g, u in zip(torch.chunk(gate, tp), torch.chunk(up, tp))]
        elif kind == "column":
            pieces = list(torch.chunk(tensor, tp, dim=0))
        elif kind == "row":
            pieces = list(torch.chunk(tensor, tp, dim=1))
        else:
            pieces = [tensor] * tp
        for rank, piece in enumerate(pieces):
            shards[rank][name] = piece.clone()
    return shards


def gather_tp(shards: list[State]) -> State:
    """Inverse of `shard_tp` (what a TP group all-gathers before a sync or an HF export)."""
    out: State = {}
    for name in shards[0]:
        pieces = [shard[name] for shard in shards]
        kind = _tp_kind(name)
        if kind == "fc1":
            halves = [torch.chunk(p, 2, dim=0) for p in pieces]
            out[name] = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
        elif kind == "column":
            out[name] = torch.cat(pieces, dim=0)
        elif kind == "row":
            out[name] = torch.cat(pieces, dim=1)
        else:
            out[name] = pieces[0]
    return out


# ---- pipeline parallel ------------------------------------------------------------------------------------
def split_pp(mc: State, layout: GPTLayout, pp: int) -> list[State]:
    """Per pipeline stage, its layers renumbered from 0; embedding on stage 0, final norm and output layer
    on the last stage (with tied embeddings the last stage also needs the embedding for its output)."""
    per_stage = layout.num_layers // pp
    stages: list[State] = [{} for _ in range(pp)]
    for name, tensor in mc.items():
        match = _LAYER.match(name)
        if match:
            layer = int(match.group(1))
            stages[layer // per_stage][f"decoder.layers.{layer % per_stage}.{match.group(2)}"] = tensor
        elif name.startswith("embedding."):
            stages[0][name] = tensor
            if layout.tied_embeddings and pp > 1:
                stages[-1][name] = tensor
        else:
            stages[-1][name] = tensor
    return stages


def merge_pp(stages: list[State], layout: GPTLayout) -> State:
    per_stage = layout.num_layers // len(stages)
    out: State = {}
    for index, stage in enumerate(stages):
        for name, tensor in stage.items():
            match = _LAYER.match(name)
            if match:
                out[f"decoder.layers.{index * per_stage + int(match.group(1))}.{match.group(2)}"] = tensor
            elif name not in out:
                out[name] = tensor
    return out
