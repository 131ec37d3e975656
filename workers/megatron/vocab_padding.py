"""Megatron pads the vocabulary so every tensor-parallel rank holds an equal slice of the embedding and the output
layer (megatron-core's `make_vocab_size_divisible_by`, 128 rows per rank by default). Torch-free: the memory plan
(trainer/memory_plan) counts the padded rows too."""

from __future__ import annotations

VOCAB_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
