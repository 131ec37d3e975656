"""The Qwen2.5 shapes the GPU benchmarks build random-init models of (only the sizes matter there)."""

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
