"""The mixture-of-experts part of a decoder's shape (Qwen2-MoE, Qwen3-MoE in transformers 5): which layers are
sparse, their parameters, the matmul work of one token, and what a sparse MLP block keeps for backward.

A sparse layer's MLP (modeling_qwen{2,3}_moe.py) is a router (`mlp.gate`, a `num_experts x hidden` weight used
through F.linear, not an nn.Linear), `num_experts` SwiGLU experts stored as two 3-D parameters (gate_up_proj
`E x 2m x h`, down_proj `E x h x m`, m = moe_intermediate_size) and, in Qwen2-MoE, a shared expert (an ordinary
gated MLP of shared_expert_intermediate_size) with a 1-wide sigmoid gate (`shared_expert_gate`, an nn.Linear).
Layer i is sparse when it is not in `mlp_only_layers` and (i + 1) % decoder_sparse_step == 0; the other layers
have a dense MLP of intermediate_size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from workers.lora.moe_vllm import EXPERT_TARGETS  # the names PEFT maps onto the fused experts

# Model types whose sparse layers these formulas count exactly (checked against transformers in the tests).
EXACT_MOE_TYPES = ("qwen2_moe", "qwen3_moe")
INDEX = 8  # int64 index tensors (top-k ids, the sort permutation and its inverse)
FP32 = 4


@dataclass(frozen=True)
class MoeShape:
    experts: int  # num_experts
    top_k: int  # num_experts_per_tok
    expert_intermediate: int  # moe_intermediate_size
    shared_intermediate: int = 0  # shared_expert_intermediate_size (0: no shared expert)
    dense_layers: tuple[int, ...] = ()  # layer indices with a dense MLP (intermediate_size) instead
    norm_topk: bool = False  # norm_topk_prob: the top-k weights are renormalized (one more saved tensor)
    # PEFT (0.21) maps the transformers-4 names of Qwen3-MoE's experts and router (gate_proj/up_proj/down_proj,
    # gate) onto transformers 5's fused parameters: adapters on gate_up_proj (rank 2r per expert), down_proj
    # (rank r per expert) and the router; those names then adapt no dense MLP. Qwen2-MoE's experts get none.
    peft_experts: bool = False

    def sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers

    # ---- parameters of one sparse MLP block ------------------------------------------------------------
    def router_params(self, hidden: int) -> int:
        return self.experts * hidden

    def experts_params(self, hidden: int) -> int:
        return self.experts * 3 * hidden * self.expert_intermediate

    def shared_linears(self, hidden: int) -> dict[str, tuple[int, int]]:
        """(in, out) of the shared expert's nn.Linear layers (PEFT's "all-linear" adapts these, not the experts)."""
        s = self.shared_intermediate
        if not s:
            return {}
        return {"gate_proj": (hidden, s), "up_proj": (hidden, s), "down_proj": (s, hidden),
                "shared_expert_gate": (hidden, 1)}

    def block_params(self, hidden: int) -> int:
        shared = sum(a * b for a, b in self.shared_linears(hidden).values())
        return self.router_params(hidden) + self.experts_params(hidden) + shared

    def largest_tensor(self, hidden: int) -> int:
        """Elements of the larger expert parameter: gate_up_proj (E x 2m x h), one tensor for all experts."""
        return self.experts * 2 * self.expert_intermediate * hidden

    def active_multiply_adds(self, hidden: int) -> int:
        """Multiply-adds of one token through a sparse block: the router over every expert, its top-k experts'
        three projections, the shared expert and its gate."""
        shared = sum(a * b for a, b in self.shared_linears(hidden).values())
        return self.router_params(hidden) + self.top_k * 3 * hidden * self.expert_intermediate + shared


def sparse_lora_params(moe: MoeShape, hidden: int, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters of one sparse block (PEFT's layout: per expert A is rank x in, B out x rank)."""
    if not moe.peft_experts:
        linears = moe.shared_linears(hidden)
        return sum(rank * (linears[n][0] + linears[n][1]) for n in targets if n in linears)
    e, h, m = moe.experts, hidden, moe.expert_intermediate
    params = rank * (h + e) if "gate" in targets else 0
    params += 2 * rank * e * (h + 2 * m) if {"gate_proj", "up_proj"} <= set(targets) else 0
    return params + (rank * e * (m + h) if "down_proj" in targets else 0)


def engine_sparse_lora_params(moe: MoeShape, hidden: int, slot: int, targets: tuple[str, ...]) -> int:
    """vLLM's adapter buffers of one sparse block at its rank slot `slot`: the router's, and for fused experts a
    gate, an up and a down slice per expert (vLLM splits PEFT's fused factors per expert: E x slot x (3H + 3F))."""
    if not moe.peft_experts:
        return sparse_lora_params(moe, hidden, slot, targets)
    params = slot * (hidden + moe.experts) if "gate" in targets else 0
    if set(targets) & EXPERT_TARGETS:
        params += moe.experts * slot * 3 * (hidden + moe.expert_intermediate)
    return params


def expert_count(config: Mapping[str, Any]) -> int:
    """Experts per sparse layer of a language model's config dict; 0 for a dense model."""
    # transformers 5 writes num_experts as `num_local_experts` (its attribute map); the Hub configs say num_experts.
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def moe_from_config(config: Mapping[str, Any], layers: int) -> MoeShape | None:
    """The MoE fields of a language model's config dict (transformers' names and defaults), or None for a dense
    model (no `moe_intermediate_size`, or no experts)."""
    experts = expert_count(config)
    if not experts or "moe_intermediate_size" not in config:
        return None
    step = int(config.get("decoder_sparse_step") or 1)
    only_mlp = {int(i) for i in (config.get("mlp_only_layers") or [])}
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step != 0)
    # Qwen2-MoE defaults the shared expert to 5632 wide when config.json leaves it out; Qwen3-MoE has none.
    shared_default = 5632 if config.get("model_type") == "qwen2_moe" else 0
    return MoeShape(
        experts=experts, top_k=int(config.get("num_experts_per_tok") or 1),
        expert_intermediate=int(config["moe_intermediate_size"]),
        shared_intermediate=int(config.get("shared_expert_intermediate_size", shared_default) or 0),
        dense_layers=dense, norm_topk=bool(config.get("norm_topk_prob") or False),
        peft_experts=config.get("model_type") == "qwen3_moe",
    )


def sparse_saved_bytes(moe: MoeShape, hidden: int, e: int, full: bool, liger: bool = False) -> int:
    """Bytes per token a sparse MLP block keeps for backward (transformers' default `grouped_mm` experts path,
    integrations/moe.py), beside its input when a trained router or shared expert keeps it (the caller's term).

    The router keeps its float32 softmax (E) and the top-k ids; the experts path sorts the token x top-k pairs by
    expert and keeps the gather and un-permute indices, the top-k copies of each token's hidden state (the up
    projection's input, when the experts train), the up projection's output (2m: SiLU's and the product's
    input), SiLU's output, the product (the down projection's input, when the experts train), the down output
    and the routing weights (their product's inputs). With Liger (transformers 5) the experts are its fused MoE
    kernel instead, which keeps the up projection's output, the routing weights and int32 routing indices.
    """
    k, m, h = moe.top_k, moe.expert_intermediate, hidden
    router = FP32 * moe.experts + INDEX * k + (FP32 * k + FP32 if moe.norm_topk else 0)
    if liger:
        experts = 2 * e * k * m + e * k + 3 * 4 * k
    else:
        kept_input = e * k * h if full else 0
        experts = 3 * INDEX * k + kept_input + 3 * e * k * m + (e * k * m if full else 0) + e * k * h + e * k
    return router + experts + _shared_saved_bytes(moe, h, e, full)


def _shared_saved_bytes(moe: MoeShape, hidden: int, e: int, full: bool) -> int:
    """Qwen2-MoE's shared expert as a dense gated MLP (gate and up outputs, SiLU's output, the product when
    down_proj trains), its sigmoid gate's output and the expert's output (the gating product's inputs)."""
    s = moe.shared_intermediate
    if not s:
        return 0
    return 3 * e * s + (e * s if full else 0) + e + e * hidden


def sparse_forward_peak_bytes(moe: MoeShape, hidden: int, e: int) -> int:
    """Bytes per token of a sparse block's largest moment in a no-grad forward (fitted on CPU): the top-k copies
    of the hidden state stay while the up output, SiLU and product (4km), then the down output, its weighted and
    un-permuted copies (3kh) live; the router's logits, float32 probabilities and the int64 sort indices beside.
    Qwen2-MoE's shared expert runs first (its gated MLP, 3s), its output (h) stays through the experts."""
    k, m, h = moe.top_k, moe.expert_intermediate, hidden
    router = (2 * FP32 + e) * moe.experts + 5 * INDEX * k
    experts = e * (k * h + max(4 * k * m, k * m + k * h, 3 * k * h)) + router
    s = moe.shared_intermediate
    return max(3 * e * s, e * h + experts) if s else experts


def sparse_backward_bytes(moe: MoeShape, hidden: int, e: int) -> int:
    """What a sparse block's backward allocates beyond its saved tensors (fitted on CPU): the gradients of the
    top-k copies of the hidden state (two of k x h), or, when larger, a dense MLP's term at the active width."""
    k, h = moe.top_k, hidden
    width = k * moe.expert_intermediate + moe.shared_intermediate
    dense = e * width + 16 * h if e < FP32 else 2 * e * width + FP32 * h
    return max(dense, 2 * e * k * h + FP32 * h)


def sparse_recompute_bytes(moe: MoeShape, hidden: int, e: int) -> int:
    """With gradient checkpointing, what the recomputed sparse layer's backward adds to its saved tensors (fitted
    on CPU): the gradients of the top-k copies of the hidden state, and the shared expert's as a dense MLP's."""
    s = moe.shared_intermediate
    return 2 * e * moe.top_k * hidden + (2 * e * (s - hidden) if s > hidden else 0)
