"""What a vLLM engine holds on a GPU besides its weights and its KV cache: the peak of the profile run vLLM makes as
it starts, and its CUDA graphs' pool.

vLLM (0.26, `gpu_worker.determine_available_memory`) gives its KV cache what `gpu_memory_utilization` x the GPU's
CUDA total (gpu.py) leaves after its weights, the torch peak of that profile run, its memory outside PyTorch and its
CUDA graphs' estimate. The profile run is one forward over `max_num_batched_tokens` tokens, then the sampler over
`max_num_seqs` requests with top-k and top-p set. A mixture of experts' fused-MoE workspace, sized by the forward's
tokens, stays allocated through the sampler (vLLM's workspace manager keeps it), so there the two add up. The terms
below are read off `benchmarks/engine_profile_sweep.py`, which starts engines over both limits and reads each
term apart (docs/benchmarks.md). These bytes decide how many sequences the cache holds at once
(engine_concurrency.py) and, with a fixed cache (rollout.kv_cache_gib), what the engine takes beyond it.
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
# The sampler's profile (v1/worker/gpu_model_runner._dummy_sampler_run: top-k and top-p set, then again through its
# native path with a generator) over max_num_seqs requests x the vocabulary. Read with engine_profile_sweep (H200,
# vLLM 0.26, 2026-12-02) on Qwen3-30B-A3B's shape: 2.857 GiB at 1024 requests and 0.893 at 256, less the experts'
# workspace (0.125 GiB at 2048 tokens): 18.1 bytes a logit above a fixed 0.11 GiB. The same count at 16 384 tokens
# (workspace 1.0 GiB) gives the full 30B-A3B's 3.73 where vLLM read 3.79. Dense Qwen2 shapes read less (7B with 2
# layers and LoRA: 0.35 GiB in all at 1024 requests; the full 7B's 2.09-2.15 is its forward), not yet explained:
# the count errs high there, which costs cache, not memory.
SAMPLER_BYTES_PER_LOGIT = 18
SAMPLER_FIXED_BYTES = 1 << 27
# The forward's largest live activations per token, in hidden-size vectors beyond the MLP's or the attention's own:
# the residual stream, the normed input, the attention output and the layer's output. Against engine_profile_sweep
# (2 layers, 16 requests): 7B over 16 384 tokens read 2.21 GiB where this count says 2.17; 30B-A3B 1.64 (1.68).
FORWARD_HIDDEN_VECTORS = 4


def engine_step_limits(setup: PlanSetup, gpu_bytes: int | None) -> tuple[int, int]:
    """(sequences, tokens) one engine step runs at most: rollout.max_num_seqs and rollout.max_num_batched_tokens,
    or vLLM's defaults for the GPU's size."""
    seqs, tokens = SMALL_GPU_LIMITS if gpu_bytes and gpu_bytes < LARGE_GPU_BYTES else LARGE_GPU_LIMITS
    rollout = setup.rollout
    return rollout.max_num_seqs or seqs, rollout.max_num_batched_tokens or tokens


def sampler_profile_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The sampler's own peak in the profile run: every request's logits over the whole vocabulary (each
    tensor-parallel rank samples from the gathered logits, so they are not split)."""
    seqs, _ = engine_step_limits(setup, gpu_bytes)
    return seqs * setup.actor.shape.vocab * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES


def moe_workspace_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """A mixture of experts' fused-MoE workspace (vLLM's Triton experts: two buffers of top-k x the wider of the
    hidden size and the expert's width, one of them doubled for gate and up, per token) over the forward's tokens,
    on one of the engine's GPUs; kept allocated after the forward. 0 for a dense model."""
    shape, tp = setup.actor.shape, max(1, setup.rollout.tp)
    if shape.moe is None:
        return 0
    _, tokens = engine_step_limits(setup, gpu_bytes)
    width = shape.moe.expert_intermediate // tp
    per_token = shape.moe.top_k * (max(width, shape.hidden) + max(2 * width, shape.hidden))
    return tokens * per_token * setup.rollout.engine_e


def forward_profile_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The forward's peak in the profile run: for each of max_num_batched_tokens tokens, the larger of a dense
    MLP's activations (gate and up projections and their product; a shared expert's) and the attention's (its query,
    key and value projections, their normed copies and its output), a few hidden-size vectors, and a mixture of
    experts' workspace, on one of the engine's GPUs."""
    _, tokens = engine_step_limits(setup, gpu_bytes)
    shape, tp = setup.actor.shape, max(1, setup.rollout.tp)
    attention = 3 * (shape.heads + shape.kv_heads) * shape.head_dim // tp
    dense = shape.moe is None or bool(shape.moe.dense_layers)
    mlp = 3 * shape.intermediate // tp if dense else 0
    if shape.moe is not None:  # a shared expert is a dense MLP of its own width beside the routed ones
        mlp = max(mlp, 3 * shape.moe.shared_intermediate // tp)
    per_token = max(attention, mlp)
    per_token += FORWARD_HIDDEN_VECTORS * shape.hidden
    return tokens * per_token * setup.rollout.engine_e + moe_workspace_bytes(setup, gpu_bytes)


def sampling_peak_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The profile run's peak while it samples: the sampler's own, over what the forward left allocated."""
    return moe_workspace_bytes(setup, gpu_bytes) + sampler_profile_bytes(setup, gpu_bytes)


def profile_peak_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """The profile run's peak (vLLM's `peak_activation_memory`): the larger of its forward's and its sampling's."""
    return max(forward_profile_bytes(setup, gpu_bytes), sampling_peak_bytes(setup, gpu_bytes))


def engine_overhead_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """A vLLM engine's bytes on one of its GPUs beyond its weights and KV cache: the profile run's peak and the CUDA
    graphs' pool (SLEEPING_ENGINE_BYTES)."""
    return profile_peak_bytes(setup, gpu_bytes) + SLEEPING_ENGINE_BYTES
