"""What the plan counts for a vLLM engine beside its weights and KV cache: the larger peak of vLLM's start-up profile
(its sampler over max_num_seqs requests x the vocabulary, or its forward over max_num_batched_tokens tokens) and its
CUDA graphs, with vLLM's defaults by the GPU's size; and the one measurement it is held to."""

import json

import pytest

from benchmarks.model_shapes import QWEN3_30B_A3B
from trainer.config_loader import load_config
from trainer.memory_plan.engine_concurrency import engine_concurrency
from trainer.memory_plan.engine_profile import (
    SAMPLER_BYTES_PER_LOGIT,
    SLEEPING_ENGINE_BYTES,
    engine_overhead_bytes,
    engine_step_limits,
    forward_profile_bytes,
    sampler_profile_bytes,
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
    assert sampler_profile_bytes(one, 141 * GIB) == 1024 * VOCAB * SAMPLER_BYTES_PER_LOGIT
    assert sampler_profile_bytes(two, 141 * GIB) == sampler_profile_bytes(one, 141 * GIB)
    assert sampler_profile_bytes(one, 40 * GIB) == 256 * VOCAB * SAMPLER_BYTES_PER_LOGIT
    assert forward_profile_bytes(two, 141 * GIB) < forward_profile_bytes(one, 141 * GIB)  # the experts' widths split


def test_a_mixture_of_experts_forward_counts_its_active_experts_and_wins_where_few_requests_are_sampled(model_30b):
    few = setup_of(model_30b, "actor_rollout_ref.rollout.max_num_seqs=16")
    hidden, width, top_k = QWEN3_30B_A3B["hidden_size"], QWEN3_30B_A3B["moe_intermediate_size"], 8
    # per token: each of the top-k experts' gate and up outputs and their product, and its output; four hidden vectors
    assert forward_profile_bytes(few, 141 * GIB) == 16384 * (top_k * (3 * width + hidden) + 4 * hidden) * 2
    assert forward_profile_bytes(few, 141 * GIB) > sampler_profile_bytes(few, 141 * GIB)
    assert engine_overhead_bytes(few, 141 * GIB) == forward_profile_bytes(few, 141 * GIB) + SLEEPING_ENGINE_BYTES


def test_the_plan_comes_within_three_percent_of_the_cache_vllm_sized_on_an_h200(model_30b):
    """Measured at 2e96772 (2026-12-02, one H200: 139.81 GiB to CUDA, 140.4 to NVML): vLLM's start-up figures
    (rollout/engine_memory/*_gib) weights 60.05, activation peak 3.79, CUDA graphs 0.25, outside PyTorch 0.09, KV
    cache 5.72 GiB: rollout/kv_cache_sequences 102.8 sequences of 608 tokens. The plan said 155 with its former
    1.5 GiB allowance, then 111 while it took NVML's total and 24 bytes a sampled logit."""
    setup = setup_of(model_30b)
    cuda_total = int(139.81 * GIB)
    assert abs(sampler_profile_bytes(setup, cuda_total) / GIB - 3.79) < 0.05
    found = engine_concurrency(setup, cuda_total)
    assert found.length == 608 and found.per_step == 64
    assert abs(found.kv_bytes / GIB - 5.72) / 5.72 < 0.03
    assert abs(found.at_once - 102.8) / 102.8 < 0.03
