"""Build a tiny random-init Qwen3-MoE with the character tokenizer, offline.

    python -m trainer.tiny_moe OUT_DIR [--seed N] [--kv-heads K]

The mixture-of-experts counterpart of trainer/tiny_model.py (same tokenizer, chat template, attention sizes and
depth): every layer's MLP is 8 experts of width 64 with 2 active per token, so a token runs about as many MLP
weights as one 128-wide dense MLP. `actor_rollout_ref.model.path=outputs/tiny_moe` builds it when missing and
trains it on the default task.
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from trainer.tiny_model import (
    _make_tokenizer_config_portable,
    build_char_tokenizer,
    build_tiny_config,
    run_builder,
    seeded_model,
)

EXPERTS = 8
ACTIVE_EXPERTS = 2
EXPERT_WIDTH = 64


def build_tiny_moe_config(tokenizer) -> Qwen3MoeConfig:  # noqa: ANN001 - the tokenizer build_char_tokenizer gives
    """The tiny dense config's attention and sizes, with a sparse MLP in every layer."""
    dense = build_tiny_config(tokenizer)
    return Qwen3MoeConfig(
        vocab_size=dense.vocab_size,
        hidden_size=dense.hidden_size,
        intermediate_size=dense.intermediate_size,  # unused: no layer is dense (mlp_only_layers is empty)
        moe_intermediate_size=EXPERT_WIDTH,
        num_experts=EXPERTS,
        num_experts_per_tok=ACTIVE_EXPERTS,
        norm_topk_prob=True,
        num_hidden_layers=dense.num_hidden_layers,
        num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads,
        head_dim=dense.hidden_size // dense.num_attention_heads,  # 64, which vLLM's CPU attention accepts
        max_position_embeddings=dense.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_tiny_moe(out_dir: str | Path, seed: int = 0, num_key_value_heads: int | None = None) -> Path:
    """Write tokenizer + random-init Qwen3MoeForCausalLM to `out_dir`; same seed -> same weights.
    `num_key_value_heads=2` gives a shape that tensor parallelism of 2 can split (the default has one)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    config = build_tiny_moe_config(tokenizer)
    if num_key_value_heads is not None:
        config.num_key_value_heads = num_key_value_heads
    model = seeded_model(Qwen3MoeForCausalLM, config, tokenizer, seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _make_tokenizer_config_portable(out / "tokenizer_config.json")
    return out


def main(argv: list[str] | None = None) -> None:
    run_builder(argv, __doc__, build_tiny_moe, "tiny mixture-of-experts model", kv_heads=True)


if __name__ == "__main__":
    main()
