"""megatron-core `GPTModel` for a Qwen2/Qwen3/Llama-style HF config (dense or Qwen3-MoE), and loading its HF
weights per TP/PP/EP rank."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from workers.megatron.convert import hf_to_megatron, shard_tp
from workers.megatron.hf_reader import HFCheckpointReader
from workers.megatron.layout import GPTLayout
from workers.megatron.moe import (
    allow_router_without_transformer_engine,
    expert_index,
    moe_config_kwargs,
    select_ep,
    use_expert_groups_for_folded_experts,
)
from workers.megatron.router_training import RouterTraining


@dataclass(frozen=True)
class ParallelSettings:
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    ep: int = 1  # expert parallel: the experts of each MoE layer split over this many ranks
    etp: int | None = None  # expert tensor parallel: each expert split over this many ranks (None: the TP size)

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> "ParallelSettings":
        return cls(
            tp=section["tensor_model_parallel_size"],
            pp=section["pipeline_model_parallel_size"],
            # One TP rank has nothing to scatter the sequence over.
            sequence_parallel=section["sequence_parallel"] and section["tensor_model_parallel_size"] > 1,
            use_distributed_optimizer=section["use_distributed_optimizer"],
            ep=section.get("expert_model_parallel_size") or 1,
            etp=section.get("expert_tensor_parallel_size"),
        )

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp


def rope_theta(hf_config: Any) -> float:
    """The RoPE base of an HF config; scaled RoPE variants are refused (the local layer spec lacks them)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported by the Megatron backend; supported: ['default']")
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def transformer_config(
    hf_config: Any,
    layout: GPTLayout,
    settings: ParallelSettings,
    dtype: torch.dtype,
    recompute: bool = False,
    router: RouterTraining | None = None,
) -> Any:
    """The megatron-core TransformerConfig that computes what the HF model computes (no dropout, RMSNorm,
    SwiGLU, grouped-query attention, fused kernels off so the plain-torch paths run everywhere). `recompute`
    (model.enable_gradient_checkpointing): each layer keeps only its input for the backward and runs again there,
    as the FSDP workers' checkpointed layers do. `router`: a mixture of experts' router losses and dtype."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    router = router or RouterTraining()
    if layout.moe is None and not router.is_default:
        raise ValueError(
            f"router losses or dtype are set (actor.router_aux_loss_coef or megatron.override_transformer_config."
            f"moe_*), but model_type {getattr(hf_config, 'model_type', None)!r} is a dense model (no router); "
            "leave them unset"
        )
    moe = {
        "moe_token_dispatcher_type": "alltoall",  # a dense model: only to pass the config check of variable lengths
        **moe_config_kwargs(layout.moe, settings.ep, settings.expert_tp),
        **(router.config_kwargs(layout.num_layers) if layout.moe is not None else {}),
    }
    recomputed = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_layernorm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=settings.tp,
        pipeline_model_parallel_size=settings.pp,
        sequence_parallel=settings.sequence_parallel,
        pipeline_dtype=dtype,
        params_dtype=torch.float32,  # master weights; Float16Module casts the compute copy
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        # Every rank's stage exchanges its real shapes: micro-batches may differ in size.
        variable_seq_lengths=settings.pp > 1,
        **moe,
        **(recomputed if recompute else {}),
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )


def build_gpt_model(
    config: Any, layout: GPTLayout, max_positions: int, rope_base: float, value_head: bool = False
) -> nn.Module:
    """This rank's pipeline stage of the GPT model (float32, on the CPU; the caller moves it). With
    `value_head`, the vocabulary projection is replaced by one value per token (a critic)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if layout.moe is not None:
        allow_router_without_transformer_engine()
    layer = get_gpt_layer_local_spec(
        num_experts=layout.moe.num_experts if layout.moe else None,
        moe_grouped_gemm=False,
        qk_layernorm=layout.qk_layernorm,
    )
    layer.submodules = replace(layer.submodules, input_layernorm=RMSNorm, pre_mlp_layernorm=RMSNorm)
    if layout.qk_layernorm:
        attention = layer.submodules.self_attention
        attention.submodules = replace(attention.submodules, q_layernorm=HeadRMSNorm, k_layernorm=HeadRMSNorm)
    per_stage = layout.num_layers // config.pipeline_model_parallel_size
    model = GPTModel(
        config=config,
        transformer_layer_spec=TransformerBlockSubmodules(layer_specs=[layer] * per_stage, layer_norm=RMSNorm),
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=max_positions,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=layout.tied_embeddings and not value_head,
        position_embedding_type="rope",
        rotary_base=rope_base,
    )
    if value_head and ps.is_pipeline_last_stage():
        model.output_layer = ValueHead(config.hidden_size, config.sequence_parallel)
    use_expert_groups_for_folded_experts(model, config.tensor_model_parallel_size, config.expert_tensor_parallel_size)
    return model


def ignore_padding_lookups(model: nn.Module, pad_token_id: int | None) -> None:
    """HF embeddings are built with `padding_idx=pad_token_id`: looking the pad token up adds no gradient
    to its row. Do the same here (the forward value is unchanged), so both backends train identically."""
    from megatron.core import parallel_state as ps

    embedding = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if pad_token_id is None or embedding is None:
        return

    def detach_pad_rows(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        is_pad = args[0] == pad_token_id  # [b, s]
        if output.shape[:2] != is_pad.shape:
            # Sequence parallel: [s / tp, b, h], this TP rank's part of the sequence.
            size = output.shape[0]
            start = ps.get_tensor_model_parallel_rank() * size
            is_pad = is_pad.t()[start : start + size]
        return torch.where(is_pad.unsqueeze(-1).contiguous(), output.detach(), output).contiguous()

    embedding.register_forward_hook(detach_pad_rows)


class RMSNorm(nn.Module):
    """RMSNorm usable with sequence parallelism (megatron-core's torch fallback norm refuses it): its weight
    is marked `sequence_parallel`, so Megatron all-reduces that gradient over the TP group, where each
    rank saw only its part of the sequence."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(hidden, self.weight.shape, self.weight, self.eps)


class HeadRMSNorm(RMSNorm):
    """Qwen3's per-head query/key RMSNorm. It runs after the QKV projection, on every token of this TP rank's
    heads, so its weight is not `sequence_parallel`: Megatron all-reduces q/k_layernorm gradients over TP by name."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(config, hidden_size, eps)
        setattr(self.weight, "sequence_parallel", False)


class ValueHead(nn.Module):
    """hidden [s, b, h] -> values [s, b, 1], replicated on every TP rank; stands in for GPTModel's
    output layer, so it takes (and ignores) the same keyword arguments and returns (output, bias)."""

    def __init__(self, hidden_size: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(1, hidden_size))
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.weight, std=0.02)

    def forward(
        self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # Every TP rank computes the same loss on the whole sequence: the backward takes its own slice.
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return nn.functional.linear(hidden, self.weight.to(hidden.dtype), self.bias.to(hidden.dtype)), None


@dataclass(frozen=True)
class RankCoordinate:
    """Where a rank sits in Megatron's groups: its TP and PP ranks, and for the experts its EP and expert-TP ranks."""

    tp_rank: int = 0
    pp_rank: int = 0
    ep_rank: int = 0
    etp_rank: int = 0

    @classmethod
    def current(cls) -> "RankCoordinate":
        """This process's coordinate in the initialised parallel state."""
        from megatron.core import parallel_state as ps

        return cls(
            ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(),
            ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank(),
        )


def stage_state(
    reader: HFCheckpointReader,
    layout: GPTLayout,
    settings: ParallelSettings,
    rank: RankCoordinate,
    value_head: bool = False,
) -> dict[str, torch.Tensor]:
    """This rank's tensors (Megatron names, layers numbered within the stage, its EP rank's experts numbered
    from 0, split over expert TP) read from an HF folder; with `value_head` the LM head is left out (a critic's head
    is new)."""
    pp, pp_rank = settings.pp, rank.pp_rank
    per_stage = layout.num_layers // pp
    last = pp_rank == pp - 1
    # The last stage of a tied model holds its own copy of the embedding, as its output layer.
    embedding = pp_rank == 0 or (last and layout.tied_embeddings and not value_head)
    hf = reader.stage_tensors(range(pp_rank * per_stage, (pp_rank + 1) * per_stage), embedding, last)
    if value_head:
        hf.pop("lm_head.weight", None)
    whole = select_ep(hf_to_megatron(hf, replace(layout, num_layers=per_stage)), layout.moe, settings.ep, rank.ep_rank)
    experts = {name: tensor for name, tensor in whole.items() if expert_index(name) is not None}
    dense = {name: tensor for name, tensor in whole.items() if name not in experts}
    state = shard_tp(dense, settings.tp)[rank.tp_rank] | shard_tp(experts, settings.expert_tp)[rank.etp_rank]
    if pp > 1 and last and layout.tied_embeddings and not value_head:
        state["output_layer.weight"] = state.pop("embedding.word_embeddings.weight")
    return state


def load_stage_state(model: nn.Module, state: dict[str, torch.Tensor], value_head: bool = False) -> None:
    """Copy `state` into the model; every parameter must be covered (except a new value head)."""
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    missing = sorted(
        name
        for name in own
        if name not in state
        and not name.endswith("_extra_state")
        and not (value_head and name.startswith("output_layer."))
    )
    if unknown or missing:
        raise RuntimeError(f"HF -> Megatron load: names not in the model {unknown}; model tensors not loaded {missing}")
    with torch.no_grad():
        for name, tensor in state.items():
            if own[name].shape != tensor.shape:
                raise RuntimeError(
                    f"HF -> Megatron load: {name} has shape {tuple(tensor.shape)}, "
                    f"the model wants {tuple(own[name].shape)}"
                )
            own[name].copy_(tensor)
