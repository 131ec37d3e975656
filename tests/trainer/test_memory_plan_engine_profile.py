"""What the plan counts for a vLLM engine beside its weights and KV cache: the larger peak of vLLM's start-up profile
(its sampler over max_num_seqs requests x the vocabulary, over a mixture of experts' workspace, or its forward over
max_num_batched_tokens tokens) and its CUDA graphs, with vLLM's defaults by the GPU's size; and the measurements it is
held to (engine_profile_sweep's readings and a full 30B-A3B engine's start, both on an H200)."""

import json

import pytest

from benchmarks.engine_profile_sweep import Variant, planned
from benchmarks.model_shapes import QWEN3_30B_A3B
from benchmarks.random_model import write_config
from benchmarks.scale_step import shape_of
from trainer.config_loader import load_config
from trainer.memory_plan.engine_concurrency import engine_concurrency
from trainer.memory_plan.engine_profile import (
    SAMPLER_BYTES_PER_LOGIT,
    SAMPLER_FIXED_BYTES,
    SLEEPING_ENGINE_BYTES,
    engine_overhead_bytes,
    engine_step_limits,
    forward_profile_bytes,
    moe_workspace_bytes,
    profile_peak_bytes,
    sampler_profile_bytes,
    sampling_peak_bytes,
)
from trainer.memory_plan.setup import plan_setup

GIB = 1 << 30
VOCAB = QWEN3_30B_A3B["vocab_size"]


@pytest.fixture(scope="module")
def model_30b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_30b_a3b")
    (folder / "config.json").write_text(json.dumps({**QWEN3_30B_A3B, "model_type": "qwen3_moe"}))
    return str(folder)


def setup_of(model: str, *extra: str):
    """The 30B-A3B LoRA r16 run on one H200 (benchmarks.md, "30B-A3B on one H200 with a 16K-token update budget"):
    8 prompts x 8 responses of 96 + 512 tokens, a hybrid engine at 0.5."""
    cfg = load_config([
        f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=1", "trainer.device=cuda",
        "data.train_batch_size=8", "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=96",
        "data.max_response_length=512", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384", "actor_rollout_ref.model.lora_rank=16", *extra,
    ])
    return plan_setup(cfg, on_gpu=True)


def test_vllms_step_limits_follow_the_gpus_size_unless_set(model_30b):
    setup = setup_of(model_30b)
    assert engine_step_limits(setup, 80 * GIB) == (1024, 16384)
    assert engine_step_limits(setup, 40 * GIB) == (256, 8192)
    assert engine_step_limits(setup, None) == (1024, 16384)  # unknown: the larger, so the cache is not overstated
    capped = setup_of(model_30b, "actor_rollout_ref.rollout.max_num_seqs=64",
                      "actor_rollout_ref.rollout.max_num_batched_tokens=4096")
    assert engine_step_limits(capped, 80 * GIB) == (64, 4096)


def test_the_sampler_counts_every_requests_whole_vocabulary_on_each_tensor_parallel_gpu(model_30b):
    one = setup_of(model_30b)
    two = setup_of(model_30b, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert sampler_profile_bytes(one, 141 * GIB) == 1024 * VOCAB * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES
    assert sampler_profile_bytes(two, 141 * GIB) == sampler_profile_bytes(one, 141 * GIB)
    assert sampler_profile_bytes(one, 40 * GIB) == 256 * VOCAB * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES
    assert forward_profile_bytes(two, 141 * GIB) < forward_profile_bytes(one, 141 * GIB)  # the experts' widths split


def test_a_mixture_of_experts_keeps_its_workspace_through_the_sampler_and_its_forward_wins_over_few_requests(model_30b):
    few = setup_of(model_30b, "actor_rollout_ref.rollout.max_num_seqs=16")
    hidden, width, top_k = QWEN3_30B_A3B["hidden_size"], QWEN3_30B_A3B["moe_intermediate_size"], 8
    # vLLM's Triton experts: top-k x (the wider of the activation and the hidden size, and of gate+up and hidden)
    workspace = 16384 * top_k * (max(width, hidden) + max(2 * width, hidden)) * 2
    assert moe_workspace_bytes(few, 141 * GIB) == workspace
    # per token: the attention's query/key/value, their normed copies and its output (32 + 4 heads of 128), wider
    # than any dense MLP here (none); four hidden vectors
    attention = 3 * (32 + 4) * 128
    assert forward_profile_bytes(few, 141 * GIB) == 16384 * (attention + 4 * hidden) * 2 + workspace
    assert sampling_peak_bytes(few, 141 * GIB) == workspace + sampler_profile_bytes(few, 141 * GIB)
    assert forward_profile_bytes(few, 141 * GIB) > sampling_peak_bytes(few, 141 * GIB)
    assert engine_overhead_bytes(few, 141 * GIB) == forward_profile_bytes(few, 141 * GIB) + SLEEPING_ENGINE_BYTES


# engine_profile_sweep's readings (commit 7f1e6af, 2026-12-02, one H200, vLLM 0.26, 2 decoder layers, eager):
# vLLM's `peak_activation_memory` in GiB by (size, LoRA rank, max_num_seqs, max_num_batched_tokens).
SWEEP_READINGS = {
    ("30B-A3B", 16, 1024, 2048): 2.857, ("30B-A3B", 0, 1024, 2048): 2.857, ("30B-A3B", 16, 256, 2048): 0.893,
    ("30B-A3B", 16, 16, 16384): 1.643, ("30B-A3B", 0, 16, 16384): 1.641, ("7B", 64, 16, 16384): 2.208,
}


@pytest.mark.parametrize("key", sorted(SWEEP_READINGS))
def test_the_plan_meets_each_profile_peak_the_sweep_read_within_five_percent(tmp_path, key):
    size, rank, seqs, tokens = key
    name, shape = shape_of(size, 2)
    model = str(tmp_path / name)
    write_config(model, shape)
    sampling, forward = planned(model, Variant(seqs, tokens), rank, int(139.8 * GIB))
    assert max(sampling, forward) == pytest.approx(SWEEP_READINGS[key], rel=0.05)


def test_a_dense_models_sampler_is_counted_above_what_the_sweep_read(tmp_path):
    """7B (2 layers, LoRA r64) read 0.346 GiB at 1024 requests x 2048 tokens, far under the sampler of the
    mixture of experts over the same requests and vocabulary; not yet explained, so the plan keeps the higher count
    (less cache than vLLM finds, never less memory)."""
    name, shape = shape_of("7B", 2)
    write_config(str(tmp_path / name), shape)
    sampling, forward = planned(str(tmp_path / name), Variant(1024, 2048), 64, int(139.8 * GIB))
    assert max(sampling, forward) > 0.346


def test_the_plan_comes_within_three_percent_of_the_cache_vllm_sized_on_an_h200(model_30b):
    """Measured at 2e96772 (2026-12-02, one H200: 139.81 GiB to CUDA, 140.4 to NVML): vLLM's start-up figures
    (rollout/engine_memory/*_gib) weights 60.05, activation peak 3.79, CUDA graphs 0.25, outside PyTorch 0.09, KV
    cache 5.72 GiB: rollout/kv_cache_sequences 102.8 sequences of 608 tokens. The plan said 155 with its former
    1.5 GiB allowance, then 111 while it took NVML's total and 24 bytes a sampled logit; since the sweep, its
    profile peak is the experts' workspace over 16 384 tokens and the sampler over 1024 requests."""
    setup = setup_of(model_30b)
    cuda_total = int(139.81 * GIB)
    assert profile_peak_bytes(setup, cuda_total) == sampling_peak_bytes(setup, cuda_total)
    assert profile_peak_bytes(setup, cuda_total) / GIB == pytest.approx(3.79, rel=0.03)
    found = engine_concurrency(setup, cuda_total)
    assert found.length == 608 and found.per_step == 64
    assert abs(found.kv_bytes / GIB - 5.72) / 5.72 < 0.03
    assert abs(found.at_once - 102.8) / 102.8 < 0.03
