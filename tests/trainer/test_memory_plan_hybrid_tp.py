"""The memory plan of a hybrid vLLM engine shared by k actor ranks (rollout.tensor_model_parallel_size=k): its
weights are split over the k GPUs of the ranks sharing it."""

import json

import pytest
import torch

from benchmarks.model_shapes import QWEN3_30B_A3B
from trainer.config_loader import load_config
from trainer.memory_plan import build_plan
from trainer.memory_plan.plan import ENGINE_SHARD_BYTES, ENGINE_WORKER_PROCESS_BYTES, engine_weight_bytes
from trainer.memory_plan.setup import plan_setup

QWEN_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)


def test_a_shared_hybrid_engine_holds_a_share_of_the_weights_on_each_gpu(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))

    def engine_weights(tp):
        cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.rollout.name=vllm",
                           f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", "trainer.n_gpus_per_node=8"])
        return engine_weight_bytes(plan_setup(cfg, on_gpu=True))

    whole = engine_weights(1)
    assert whole > 14 * (1 << 30)  # 7.6B parameters in bf16
    assert engine_weights(2) == whole // 2 and engine_weights(4) == whole // 4


def test_a_tensor_parallel_hybrid_engine_adds_its_processes_or_shards_to_every_phase_after_it_starts(tmp_path):
    """rollout.engine_process=true: the first rank's engine computes in a worker process per GPU; one shard per
    trainer rank (the default) brings its communicators and kernels into each trainer process instead."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))

    def other_by_phase(tp, *extra):
        cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.rollout.name=vllm",
                           "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.rollout.share_base_weights=false",
                           f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", "trainer.n_gpus_per_node=2",
                           *extra])
        plan = build_plan(cfg, gpu_bytes=140 << 30, gpu_source="test")
        notes[(tp, *extra)] = [note for note in plan.notes if "tensor parallel 2" in note]
        return {row.phase: (row.moment, row.parts["other"]) for row in plan.groups[0].rows}

    notes = {}

    one, shards = other_by_phase(1), other_by_phase(2)
    own = other_by_phase(2, "actor_rollout_ref.rollout.engine_process=true")
    assert one.keys() == own.keys() == shards.keys() >= {"init", "generate", "ref_log_prob", "update_actor"}
    for phase, (moment, other) in own.items():
        started = moment != "models loaded"
        assert other - one[phase][1] == (ENGINE_WORKER_PROCESS_BYTES if started else 0), phase
        assert shards[phase][1] - one[phase][1] == (ENGINE_SHARD_BYTES if started else 0), phase
    assert "the engine's worker process" in notes[(2, "actor_rollout_ref.rollout.engine_process=true")][0]
    assert "in the trainer process" in notes[(2,)][0] and not notes[(1,)]


def test_a_lora_base_is_planned_shared_with_per_rank_shards_over_its_fsdp_group(tmp_path):
    """The workers' rule (workers/fsdp/shared_base.py): an engine of tensor parallel k shares the base when each
    rank holds one shard and the actor's FSDP shard group is the engine's k ranks."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))

    def shares(gpus, *extra):
        cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.rollout.name=vllm",
                           "actor_rollout_ref.model.lora_rank=64",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=2", f"trainer.n_gpus_per_node={gpus}",
                           *extra])
        return plan_setup(cfg, on_gpu=True).rollout.shares_base

    assert shares(2) is True  # fsdp_size -1 over the engine's two ranks
    assert shares(4) is False  # FSDP over four ranks, engine shards over two
    assert shares(4, "actor_rollout_ref.actor.fsdp_config.fsdp_size=2") is True
    assert shares(2, "actor_rollout_ref.rollout.engine_process=true") is False
    assert shares(2, "actor_rollout_ref.rollout.share_base_weights=false") is False


@pytest.mark.parametrize("tp", [1, 2])
def test_the_plan_and_the_workers_agree_on_sharing_a_mixture_of_experts(tmp_path, tp):
    """Qwen3-30B-A3B, LoRA: its engine shares the base at tensor parallel 1 (experts included); at 2 it does not,
    so the plan keeps the actor's own base beside the engine's weights in every phase after the engine starts."""
    from omegaconf import OmegaConf

    from workers.fsdp.shared_base import resolve_base_sharing

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    overrides = [f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.rollout.name=vllm",
                 "actor_rollout_ref.model.lora_rank=64", f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
                 f"trainer.n_gpus_per_node={tp}"]
    cfg = load_config(overrides)
    planned = plan_setup(cfg, on_gpu=True).rollout.shares_base
    section = OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)
    section["rollout"]["engine_process"] = False  # as the worker resolves null
    assert planned is resolve_base_sharing(section, torch.bfloat16, torch.bfloat16, shard_ranks=tp, experts=True)
    assert planned is (tp == 1)
    plan = build_plan(cfg, gpu_bytes=140 << 30, gpu_source="test")
    own = build_plan(load_config([*overrides, "actor_rollout_ref.rollout.share_base_weights=false"]),
                     gpu_bytes=140 << 30, gpu_source="test")
    generate, own_generate = plan.row("generate"), own.row("generate")
    if tp == 1:  # one copy of the base: the trainer's is gone once the engine has started
        assert own_generate.total - generate.total > 50 * (1 << 30) / tp
    else:
        assert generate.total == own_generate.total

