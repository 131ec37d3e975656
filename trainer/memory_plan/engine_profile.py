"""What a vLLM engine holds on a GPU besides its weights and its KV cache: the peak of the profile run vLLM makes as
it starts, and its CUDA graphs' pool.

vLLM (0.26, `gpu_worker.determine_available_memory`) gives its KV cache what `gpu_memory_utilization` x the GPU's
CUDA total (gpu.py) leaves after its weights, the torch peak of that profile run, its memory outside PyTorch and its
CUDA graphs' estimate. The profile run is one forward over `max_num_batched_tokens` tokens, then the sampler over
`max_num_seqs` requests with top-k and top-p set. Which of the two is the larger at vLLM's defaults is not settled:
30B-A3B (LoRA on its experts) read 3.79 GiB and 7B 2.09 GiB, each over 1024 x ~152K logits and 16 384 tokens
(benchmarks/engine_profile_sweep.py measures them apart; docs/benchmarks.md). These bytes
decide how many sequences the cache holds at once (engine_concurrency.py) and, with a fixed cache
(rollout.kv_cache_gib), what the engine takes beyond it.
"""

from __future__ import annotations

from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.setup import PlanSetup

# What a sleeping hybrid vLLM engine keeps outside its sleep pool: its CUDA graphs' memory pool (captured up to
# rollout.cuda_graph_max_batch) and bookkeeping. Measured 0.4-0.5 GiB at 7B on an H200 (2026-11-27).
SLEEPING_ENGINE_BYTES = 1 << 29
# vLLM's defaults for an offline engine (engine/arg_utils.py): on GPUs of 70 GiB or more (A100 excepted, which
# the plan does not tell apart: it counts the larger) an engine step runs up to 1024 sequences and 16 384 tokens;
# on smaller ones 256 and 8 192. An unknown GPU counts the larger.
LARGE_GPU_BYTES = 70 * GIB
LARGE_GPU_LIMITS = (1024, 16384)
SMALL_GPU_LIMITS = (256, 8192)
# The sampler's profile with top-k and top-p set runs their sort path (v1/sample/ops/topk_topp_sampler.py): per
# request and vocabulary entry, the logits in the model's dtype (2 bytes) and in float32 (4), their sorted copy
# (4) and the sort's int64 permutation (8), the float32 softmax of the sorted logits (4) and two boolean masks (2):
# 24 bytes by that count. vLLM measured 3.79 GiB for 1024 requests over 151 936 entries (30B-A3B, H200, 2026-12-02:
# `rollout/engine_memory/activation_peak_gib`), 26.1 bytes a logit, so the plan counts 26. But at 7B the same
# requests peaked at 2.09 GiB (14.4 bytes a logit at most; vLLM 0.26 on CUDA takes a Triton top-k/top-p path without
# the sort from 8 requests on), so the 30B-A3B peak was likely its forward (LoRA on the experts): kept until
# benchmarks/engine_profile_sweep.py measures the two apart on a GPU (lowered alone it would overstate that cache).
SAMPLER_BYTES_PER_LOGIT = 26
# The forward's largest live activations per token, in hidden-size vectors beyond the MLP's own: the residual
# stream, the normed input, the attention output and the layer's output.
FORWARD_HIDDEN_VECTORS = 4


def engine_step_limits(setup: PlanSetup, gpu_bytes: int | None) -> tuple[int, int]:
    """(sequences, tokens) one engine step runs at most: rollout.max_num_seqs and rollout.max_num_batched_tokens,
    or vLLM's defaults for the GPU's size."""
    seqs, tokens = SMALL_GPU_LIMITS if gpu_bytes and gpu_bytes < LARGE_GPU_BYTES else LARGE_GPU_LIMITS
    rollout = setup.rollout
    return rollout.max_num_seqs or seqs, rollout.max_num_batched_tokens or tokens


def sampler_profile_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The sampler's peak in the profile run: every request's logits over the whole vocabulary (each
    tensor-parallel rank samples from the gathered logits, so they are not split)."""
    seqs, _ = engine_step_limits(setup, gpu_bytes)
    return seqs * setup.actor.shape.vocab * SAMPLER_BYTES_PER_LOGIT


def forward_profile_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The forward's peak in the profile run: for each of max_num_batched_tokens tokens, the largest MLP's
    activations (a dense MLP's gate and up projections and their product; a sparse layer's, once for each of its
    top-k experts, with the expert's output) and a few hidden-size vectors, on one of the engine's GPUs."""
    _, tokens = engine_step_limits(setup, gpu_bytes)
    shape, tp = setup.actor.shape, max(1, setup.rollout.tp)
    per_token = 3 * shape.intermediate // tp
    if shape.moe is not None:
        moe = shape.moe
        sparse = moe.top_k * (3 * moe.expert_intermediate // tp + shape.hidden)
        per_token = max(sparse, per_token if moe.dense_layers else 0)
    per_token += FORWARD_HIDDEN_VECTORS * shape.hidden
    return tokens * per_token * setup.rollout.engine_e


def profile_peak_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The profile run's peak (vLLM's `peak_activation_memory`): the larger of its sampler's and its forward's."""
    return max(sampler_profile_bytes(setup, gpu_bytes), forward_profile_bytes(setup, gpu_bytes))


def engine_overhead_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """A vLLM engine's bytes on one of its GPUs beyond its weights and KV cache: the profile run's peak and the CUDA
    graphs' pool (SLEEPING_ENGINE_BYTES)."""
    return profile_peak_bytes(setup, gpu_bytes) + SLEEPING_ENGINE_BYTES
