"""Bytes of each memory term, as the workers' code allocates them (read from workers/fsdp and
workers/rl_math/logits.py, checked on CPU against torch's own accounting in the tests).

Per token of a micro-batch:
- `layer_saved_bytes`: what one decoder layer keeps for backward (autograd's saved tensors);
- `forward_peak_bytes`: the largest live intermediate of a no-grad forward (the gated MLP);
- `backward_peak_bytes`: what one layer's backward allocates on top of the saved tensors.
Per (response token x vocabulary entry), or per (chunk token x vocabulary entry) with the chunked log-probs of
workers/rl_math/chunked_logits.py: `logits_bytes`, for the three ways the workers use logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.memory_plan.moe import (
    sparse_backward_bytes,
    sparse_forward_peak_bytes,
    sparse_recompute_bytes,
    sparse_saved_bytes,
)
from trainer.memory_plan.shape import ATTENTION_NAMES, ModelShape

FP32 = 4
# log_probs_from_logits runs the log-softmax of half-precision logits over this many rows at a time.
LOG_SOFTMAX_CHUNK = 1024
# Per (response token x vocabulary entry), in bytes, with half-precision logits (bf16/fp16 compute):
#   the logits / temperature (2), then entropy_from_logits' float32 copy, shifted copy, softmax, clamped
#   copy and product (5 x 4) alive together;
HALF_LOG_PROBS_AND_ENTROPY = 22
#   in training the log-softmax chunks are also kept for backward (4): 2 + 4 + 20.
HALF_TRAIN = 26
# With float32 logits (float32 compute) the float32 copy is the logits themselves, and the log-probs come
# from logsumexp, which keeps the logits (already counted) for backward.
FP32_LOG_PROBS_AND_ENTROPY = 20
FP32_TRAIN = 20
# Chunked (logits_chunk_tokens > 0), per (token of one chunk x vocabulary entry): with entropy, the chunk's
# float32 logits and their exponentials; in training the same, as the backward recomputes a chunk (its float32
# logits and probabilities, then the gradient and its compute-dtype copy, 4 + e).
CHUNKED_WITH_ENTROPY = 8
# Log-probs alone: the float32 logits, exponentiated in place (plus, in half precision, the compute-dtype
# product while it is cast).
CHUNKED_LOG_PROBS = 4


@dataclass(frozen=True)
class Trainability:
    """Which weights of a model get gradients: all (full fine-tuning), none (frozen), or LoRA adapters on
    `lora_targets` over a frozen base."""

    full: bool
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()

    def linear_needs_input(self, name: str) -> bool:
        """A linear keeps its input for backward when its weight trains or an adapter reads the input."""
        return self.full or (self.lora_rank > 0 and name in self.lora_targets)


FULL = Trainability(full=True)


def layer_saved_bytes(
    shape: ModelShape, e: int, train: Trainability = FULL, kv_repeated: bool = True, liger: bool = False,
    layer: int = 0,
) -> int:
    """Bytes per token one decoder layer keeps for backward, without gradient checkpointing.

    RMSNorm (computed in float32): its float32 input (4h) and 1/rms (4), plus the normalized input when its
    weight trains (e*h, for the weight's gradient); the norm's output when a following linear keeps it;
    attention (flash / varlen / SDPA kernels): queries, keys and values (at the query heads when
    `kv_repeated`: the packed varlen path and SDPA with a padding mask repeat them for GQA), the output and
    the per-head log-sum-exp; the gated MLP: gate output (SiLU's input),
    SiLU output and up output (the product's inputs), and the product (down_proj's input) when down_proj
    keeps it; each adapter keeps its rank-r intermediate. With `liger` (model.use_liger, workers/liger_kernels.py)
    each RMSNorm keeps its input in the compute dtype and 1/rms only, and the fused SwiGLU keeps the gate and up
    outputs (SiLU's output is recomputed in its backward). A sparse layer `layer` of an MoE model keeps its
    router's and experts' tensors instead of the gated MLP's (`moe.sparse_saved_bytes`).
    """
    h, i = shape.hidden, shape.intermediate
    norm_weight = e * h if train.full else 0
    norm = e * h + FP32 if liger else FP32 * h + FP32 + norm_weight
    qkv_keep = any(train.linear_needs_input(n) for n in ("q_proj", "k_proj", "v_proj"))
    sparse = shape.sparse(layer)
    # A sparse block's input is kept by a trained router or shared expert (the experts keep their own copies).
    mlp_keep = train.full if sparse else any(train.linear_needs_input(n) for n in ("gate_proj", "up_proj"))
    if sparse and shape.moe.shared_intermediate:
        mlp_keep = any(train.linear_needs_input(n) for n in ("gate_proj", "up_proj", "shared_expert_gate"))
    saved = 2 * norm + e * h * (qkv_keep + mlp_keep)
    kv_width = shape.q_width if kv_repeated else shape.kv_width
    saved += e * shape.q_width + 2 * e * kv_width + FP32 * shape.heads + e * shape.q_width
    if sparse:
        saved += sparse_saved_bytes(shape.moe, h, e, train.full, liger)
    else:
        saved += (2 if liger else 3) * e * i + e * i * train.linear_needs_input("down_proj")
    if shape.qk_norm:
        widths = shape.q_width + shape.kv_width
        saved += FP32 * widths + FP32 * (shape.heads + shape.kv_heads) + (e * widths if train.full else 0)
    if train.lora_rank:
        mlp = tuple(shape.moe.shared_linears(h)) if sparse else ("gate_proj", "up_proj", "down_proj")
        adapted = ATTENTION_NAMES + mlp
        saved += e * train.lora_rank * sum(1 for n in adapted if n in train.lora_targets)
    return saved


def model_saved_bytes(
    shape: ModelShape,
    e: int,
    checkpointing: bool,
    train: Trainability = FULL,
    kv_repeated: bool = True,
    kept_layers: int = 0,
    liger: bool = False,
) -> int:
    """Bytes per token the whole decoder keeps for backward (the LM head's side is in `logits_bytes`).
    With gradient checkpointing only each layer's input stays; its activations are recomputed in backward
    (`backward_peak_bytes` adds the one layer being recomputed) — except in the last `kept_layers` layers
    (`gradient_checkpointing_layers` = layers - kept_layers), which keep theirs."""
    kept = kept_layers if checkpointing else shape.layers
    keeping = range(shape.layers - kept, shape.layers)  # the last `kept` layers keep their activations
    if shape.moe is None:
        saved_layers = kept * layer_saved_bytes(shape, e, train, kv_repeated, liger)
    else:
        saved_layers = sum(layer_saved_bytes(shape, e, train, kv_repeated, liger, layer) for layer in keeping)
    per_layers = (shape.layers - kept) * e * shape.hidden + saved_layers
    if liger:
        final_norm = e * shape.hidden + FP32
    else:
        final_norm = FP32 * shape.hidden + FP32 + (e * shape.hidden if train.full else 0)
    rotary = 2 * e * shape.head_dim if kept else 0  # cos/sin, shared by the layers that keep them
    return per_layers + final_norm + rotary + 8  # + the token ids


def backward_peak_bytes(
    shape: ModelShape,
    e: int,
    checkpointing: bool,
    train: Trainability = FULL,
    kv_repeated: bool = True,
    kept_layers: int = 0,
    liger: bool = False,
) -> int:
    """Bytes per token that the backward of the layers allocates beyond the saved tensors (fitted to torch's
    allocations on CPU, tests/trainer/test_memory_plan_terms.py): without checkpointing the gradients of the
    MLP's intermediates minus the saved ones they free, and the norms' float32 gradients; with
    checkpointing the recomputed layer's saved tensors plus its MLP gradients. With `kept_layers` (the last
    layers keep their activations) the recompute comes after their backward freed what they kept. An MoE
    model's sparse layers have their own fitted terms (`moe.py`); the larger layer kind counts."""
    h, i = shape.hidden, shape.intermediate
    plain = e * i + 16 * h if e < FP32 else 2 * e * i + FP32 * h
    saved_layer = layer_saved_bytes(shape, e, train, kv_repeated, liger)
    recompute = saved_layer + 2 * e * (i - h)
    if shape.moe is not None:
        sparse = next(layer for layer in range(shape.layers) if shape.sparse(layer))
        sparse_saved = layer_saved_bytes(shape, e, train, kv_repeated, liger, sparse)
        plain_sparse = sparse_backward_bytes(shape.moe, h, e)
        recompute_sparse = sparse_saved + sparse_recompute_bytes(shape.moe, h, e)
        dense = bool(shape.moe.dense_layers)
        plain = max(plain_sparse, plain if dense else 0)
        recompute = max(recompute_sparse, recompute if dense else 0)
        saved_layer = max(sparse_saved, saved_layer if dense else 0)
    if not checkpointing:
        return plain
    if not kept_layers:
        return recompute
    freed = kept_layers * saved_layer
    return max(plain, recompute - freed)


def forward_peak_bytes(shape: ModelShape, e: int) -> int:
    """Bytes per token of the largest moment inside one layer of a no-grad forward: the gated MLP's SiLU
    output, up output and their product (or attention's queries, keys and values at the query heads, their
    copies and the output, when larger), next to the residual stream, the layer's input, the norm's output
    and its float32 temporaries (4e + 1 bytes per hidden unit, fitted on CPU); an MoE model's sparse layers by
    `moe.sparse_forward_peak_bytes` (the larger layer kind counts)."""
    mlp = 3 * e * shape.intermediate
    if shape.moe is not None:
        sparse = sparse_forward_peak_bytes(shape.moe, shape.hidden, e)
        mlp = max(sparse, mlp if shape.moe.dense_layers else 0)
    attention = 6 * e * shape.q_width
    return max(mlp, attention) + (4 * e + 1) * shape.hidden


def logits_bytes(response_tokens: int, vocab: int, e: int, use: str, chunk_tokens: int = 0, hidden: int = 0) -> int:
    """Peak bytes of the logits side of a pass over `response_tokens` predicted tokens:
    - "log_probs_and_entropy" (old log-probs, no grad), "train" (the actor update; entropy with or without
      gradient peaks the same), "log_probs" (reference, no grad, no entropy).
    With `chunk_tokens` > 0 (the workers' default, `model.logits_chunk_tokens`): one chunk's float32 logits
    and temporaries (coefficients above), plus per token the head's input hidden states (`hidden` wide, kept
    for backward in training, where its gradient joins them) and the float32 log-probs and entropies.
    With `chunk_tokens` 0 (full logits):
    - "log_probs_and_entropy", "train": coefficients above, per response token x vocabulary entry;
    - "log_probs": the logits and the temperature-scaled copy together, or the scaled copy plus the
      log-softmax of the previous chunk and the current chunk (float32 copy and result), whichever is larger."""
    if use not in ("train", "log_probs_and_entropy", "log_probs"):
        raise ValueError(f"unknown logits use {use!r}")
    n, v = response_tokens, vocab
    if chunk_tokens > 0:
        rows = min(n, chunk_tokens)
        if use == "log_probs":
            per_entry = CHUNKED_LOG_PROBS + (e if e < FP32 else 0)
            per_token = e * hidden + FP32
        else:
            per_entry = CHUNKED_WITH_ENTROPY
            per_token = e * hidden * (2 if use == "train" else 1) + 2 * FP32
        return per_entry * rows * v + per_token * n
    if use == "train":
        return (HALF_TRAIN if e < FP32 else FP32_TRAIN) * n * v
    if use == "log_probs_and_entropy":
        return (HALF_LOG_PROBS_AND_ENTROPY if e < FP32 else FP32_LOG_PROBS_AND_ENTROPY) * n * v
    if e == FP32:  # log-probs as z[label] - logsumexp(z): one float32 temporary of the logits
        return 2 * FP32 * n * v
    first = min(n, LOG_SOFTMAX_CHUNK)
    second = min(max(n - LOG_SOFTMAX_CHUNK, 0), LOG_SOFTMAX_CHUNK)
    chunks = max(2 * FP32 * first, FP32 * first + 2 * FP32 * second) * v
    return max(2 * e * n * v, e * n * v + chunks)


def kv_cache_bytes(shape: ModelShape, e: int, sequences: int, length: int) -> int:
    """A key/value cache (HF generate's, or what a vLLM engine needs for them): every layer's keys and values of
    `sequences` sequences of `length` tokens."""
    return sequences * length * shape.layers * 2 * shape.kv_width * e
