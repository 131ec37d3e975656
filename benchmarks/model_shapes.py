"""The Qwen2.5 and Qwen3-MoE shapes the GPU benchmarks build random-init models of (only the sizes matter there)."""

from __future__ import annotations

QWEN2_0_5B = dict(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)
QWEN2_1_5B = dict(QWEN2_0_5B, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960)
QWEN2_3B = dict(QWEN2_0_5B, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                intermediate_size=11008)
# ~15 GB of bf16 weights, untied head.
QWEN2_7B = dict(QWEN2_0_5B, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
# Qwen2.5-14B and -32B: ~30 / ~65 GB of bf16 weights; 40 query and 8 KV heads of 128.
QWEN2_14B = dict(QWEN2_7B, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                 intermediate_size=13824)
QWEN2_32B = dict(QWEN2_14B, num_hidden_layers=64, intermediate_size=27648)
# Qwen3-30B-A3B's config.json: 48 layers, each of 128 experts of width 768 with 8 active per token (~30.5 B
# parameters, ~3.3 B active).
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
    num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
    max_position_embeddings=40960, rope_theta=1_000_000.0,
)
