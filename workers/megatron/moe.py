"""The mixture-of-experts part of the Megatron layout (Qwen3-MoE): its sizes, the expert-parallel (EP) checks,
and its HF <-> Megatron tensors.

HF checkpoints hold, per layer, the router `mlp.gate.weight` [E, H] and per expert e
`mlp.experts.{e}.{gate,up,down}_proj.weight`. megatron-core's `MoELayer` with `SequentialMLP` (no grouped GEMM,
so no Transformer Engine) holds `mlp.router.weight` and, on the rank of EP index r, the global experts
r*E/EP .. (r+1)*E/EP - 1 as `mlp.experts.local_experts.{0..E/EP-1}.linear_fc1/linear_fc2.weight` (fc1 = [gate; up],
split over the expert-TP ranks as the dense MLP's over the TP ranks; expert TP is the TP size unless set). The router
is replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

State = dict[str, torch.Tensor]
MOE_MODEL_TYPES = ("qwen3_moe",)
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


@dataclass(frozen=True)
class MoELayout:
    num_experts: int
    topk: int
    ffn_hidden_size: int  # one expert's width
    norm_topk_prob: bool  # renormalise the top-k routing weights to sum to 1


def moe_layout_from_hf_config(config: Any, ep: int, etp: int) -> tuple[MoELayout | None, list[str]]:
    """The MoE sizes of an HF config (None for a dense model) and what keeps EP `ep` / expert TP `etp` from splitting
    it."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MOE_MODEL_TYPES:
        if ep != 1:
            return None, [
                f"expert_model_parallel_size={ep} needs a mixture-of-experts model; model_type {model_type!r} "
                "is dense (use 1)"
            ]
        return None, []
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    width = config.moe_intermediate_size
    problems = []
    if getattr(config, "mlp_only_layers", None) or getattr(config, "decoder_sparse_step", 1) != 1:
        problems.append(
            "every layer must be sparse (mlp_only_layers=[] and decoder_sparse_step=1): the Megatron layout "
            "has one layer spec for the whole stack"
        )
    if ep < 1 or experts % ep:
        problems.append(
            f"expert_model_parallel_size {ep} must divide the number of experts ({experts}); valid EP sizes: "
            f"{[e for e in range(1, experts + 1) if experts % e == 0]}"
        )
    if width % etp:
        problems.append(f"expert tensor parallel size {etp} must divide the expert MLP size ({width})")
    moe = MoELayout(
        num_experts=experts,
        topk=config.num_experts_per_tok,
        ffn_hidden_size=width,
        norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
    )
    return moe, problems


def moe_sequence_parallel_problem(
    moe: MoELayout | None, tp: int, sequence_parallel: bool, key: str = "megatron.sequence_parallel"
) -> str | None:
    """megatron-core's MoE layer trains under tensor parallelism only with sequence parallelism (its forward raises
    otherwise, after a whole rollout): named before the run starts; `key` is the switch's name for the message."""
    if moe is None or tp == 1 or sequence_parallel:
        return None
    return (
        f"a mixture-of-experts model trained with tensor parallel size {tp} needs sequence parallelism "
        f"(megatron-core's MoE layer refuses to train without it): set {key}=true, or the tensor parallel size to 1"
    )


def moe_config_kwargs(moe: MoELayout | None, ep: int, etp: int) -> dict[str, Any]:
    """TransformerConfig fields of the MoE layers; {} for a dense model."""
    if moe is None:
        return {}
    return {
        "num_moe_experts": moe.num_experts,
        "moe_router_topk": moe.topk,
        "moe_ffn_hidden_size": moe.ffn_hidden_size,
        # HF: softmax over all experts, top-k, then (norm_topk_prob) renormalise. Without pre-softmax Megatron
        # takes the top-k logits and softmaxes them: the same renormalised weights. With it: softmax, then top-k.
        "moe_router_pre_softmax": not moe.norm_topk_prob,
        "moe_router_load_balancing_type": "none",  # no auxiliary loss (RL keeps the router as trained)
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": False,  # SequentialMLP of local MLPs: grouped GEMM needs Transformer Engine
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": etp,
    }


# ---- HF <-> Megatron ------------------------------------------------------------------------------------
def hf_moe_mlp_to_megatron(hf: State, src: str, dst: str, moe: MoELayout) -> State:
    """One layer's router and all its experts (global expert numbers) under Megatron names; `src` / `dst` are
    the layer prefixes (`model.layers.{i}.` / `decoder.layers.{i}.`)."""
    out = {dst + "mlp.router.weight": hf[src + "mlp.gate.weight"]}
    for e in range(moe.num_experts):
        expert = f"{src}mlp.experts.{e}."
        out[f"{dst}mlp.experts.local_experts.{e}.linear_fc1.weight"] = torch.cat(
            [hf[expert + "gate_proj.weight"], hf[expert + "up_proj.weight"]]
        )
        out[f"{dst}mlp.experts.local_experts.{e}.linear_fc2.weight"] = hf[expert + "down_proj.weight"]
    return out


def expert_index(name: str) -> int | None:
    """The expert number in a Megatron tensor name (None when it is not an expert's)."""
    match = re.search(r"\.mlp\.experts\.local_experts\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def renumber_expert(name: str, new: int) -> str:
    return re.sub(r"(\.mlp\.experts\.local_experts\.)\d+\.", rf"\g<1>{new}.", name, count=1)


def select_ep(mc: State, moe: MoELayout | None, ep: int, ep_rank: int) -> State:
    """The tensors the rank of EP index `ep_rank` holds: everything but other ranks' experts, its own renumbered
    from 0 (global expert ep_rank * E/EP + j is local j)."""
    if moe is None or ep == 1:
        return mc
    per = moe.num_experts // ep
    out: State = {}
    for name, tensor in mc.items():
        index = expert_index(name)
        if index is None:
            out[name] = tensor
        elif index // per == ep_rank:
            out[renumber_expert(name, index - ep_rank * per)] = tensor
    return out


def megatron_moe_tensor_to_hf(rest: str, tensor: torch.Tensor, dst: str) -> list[tuple[str, torch.Tensor]] | None:
    """HF tensors of one whole (TP-gathered) MoE tensor named `rest` within its layer, experts numbered globally;
    None when `rest` is not an MoE tensor."""
    if rest == "mlp.router.weight":
        return [(dst + "mlp.gate.weight", tensor)]
    match = _EXPERT.match(rest)
    if match is None:
        return None
    expert = f"{dst}mlp.experts.{match.group(1)}."
    if match.group(2) == "linear_fc2":
        return [(expert + "down_proj.weight", tensor)]
    gate, up = torch.chunk(tensor, 2, dim=0)
    return [(expert + "gate_proj.weight", gate), (expert + "up_proj.weight", up)]


# megatron-core's mark on a parameter: False = its gradients and optimizer state belong to the expert groups (expert
# data parallel), not the dense ones.
EXPERT_GROUPS_MARK = "allreduce"


def use_expert_groups_for_folded_experts(model: Any, tp: int, expert_tp: int) -> None:
    """megatron-core 0.16 puts expert weights in the expert groups only when EP > 1 (0.19 also when the expert-TP size
    differs from TP). With experts split apart from TP at EP 1, its gradients would be reduced over the dense
    data-parallel ranks only, without the other TP ranks' tokens: mark them as 0.19 does (before the DDP wrap)."""
    if expert_tp == tp:
        return
    for name, param in model.named_parameters():
        if expert_index(name) is not None:
            setattr(param, EXPERT_GROUPS_MARK, False)


def allow_router_without_transformer_engine() -> None:
    """megatron-core (0.16.1 at least) defines `moe_utils.te_general_gemm` only when Transformer Engine imports, yet
    its router GEMM tests `te_general_gemm is not None` unguarded: without TE every MoE forward raises
    `NameError: name 'te_general_gemm' is not defined`. None is the value its own check expects for "no TE" (the
    router then uses torch.matmul)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


_HF_EXPERT = re.compile(r"^(.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")


def copy_into_hf_model(params: dict[str, torch.Tensor], name: str, tensor: torch.Tensor) -> None:
    """Copy one checkpoint-named tensor into an in-memory HF model's parameters. transformers 5 holds a Qwen3-MoE
    layer's experts fused (`mlp.experts.gate_up_proj` [E, 2F, H]: per expert its gate rows then its up rows;
    `mlp.experts.down_proj` [E, H, F]), so a per-expert tensor goes into its expert's slice there."""
    if name in params:
        params[name].copy_(tensor)
        return
    match = _HF_EXPERT.match(name)
    if match is None:
        raise KeyError(f"the HF model has no parameter {name!r}")
    prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
    if kind == "down":
        params[prefix + "down_proj"][expert].copy_(tensor)
        return
    fused = params[prefix + "gate_up_proj"][expert]
    rows = tensor.shape[0]
    (fused[:rows] if kind == "gate" else fused[rows:]).copy_(tensor)
