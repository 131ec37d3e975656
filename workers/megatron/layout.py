"""The shape of a Qwen2/Qwen3/Llama-style model (dense, or Qwen3-MoE) in Megatron terms, and the parallel sizes it
allows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.megatron.moe import MOE_MODEL_TYPES, MoELayout, moe_layout_from_hf_config
from workers.megatron.vocab_padding import VOCAB_DIVISIBLE_BY, padded_vocab_size

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "qwen3", *MOE_MODEL_TYPES)
_QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")  # per-head RMSNorm of queries and keys before RoPE


@dataclass(frozen=True)
class GPTLayout:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int  # Megatron pads the vocabulary so every TP rank holds an equal slice
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool = False
    moe: MoELayout | None = None  # None: a dense MLP in every layer

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def layout_from_hf_config(
    config: Any,
    tp: int = 1,
    pp: int = 1,
    make_vocab_size_divisible_by: int = VOCAB_DIVISIBLE_BY,
    ep: int = 1,
    etp: int | None = None,
) -> GPTLayout:
    """Read an HF config (Qwen2, Qwen3, Qwen3-MoE or Llama family) and check that TP `tp`, PP `pp`, expert
    parallel `ep` and expert TP `etp` (None: `tp`) can split it; every problem is listed in one error naming the sizes
    involved."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by the Megatron converter; "
            f"supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    problems = []
    if tp < 1 or pp < 1:
        problems.append(f"tensor and pipeline parallel sizes must be >= 1, got tp={tp}, pp={pp}")
    else:
        if heads % tp:
            problems.append(f"tensor parallel size {tp} must divide the number of attention heads ({heads})")
        if kv_heads % tp:
            problems.append(
                f"tensor parallel size {tp} must divide the number of key/value heads ({kv_heads}); "
                "valid TP sizes for this model: "
                f"{[t for t in range(1, kv_heads + 1) if kv_heads % t == 0 and heads % t == 0]}"
            )
        if model_type not in MOE_MODEL_TYPES and config.intermediate_size % tp:
            problems.append(f"tensor parallel size {tp} must divide the MLP size ({config.intermediate_size})")
        if config.num_hidden_layers % pp:
            problems.append(
                f"pipeline parallel size {pp} must divide the number of layers ({config.num_hidden_layers})"
            )
    if heads % kv_heads:
        problems.append(f"attention heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    expert_tp = tp if etp is None else etp
    moe, moe_problems = moe_layout_from_hf_config(config, ep, max(expert_tp, 1))
    problems += moe_problems
    if problems:
        raise ValueError("cannot lay this model out for Megatron:\n  " + "\n  ".join(problems))
    return GPTLayout(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        padded_vocab_size=padded_vocab_size(config.vocab_size, tp, make_vocab_size_divisible_by),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_layernorm=model_type in _QK_NORM_MODEL_TYPES,
        moe=moe,
    )
