"""What the memory-plan tests share: the Qwen2.5-7B and -3B shapes (a folder holding only their config.json is all
the plan reads), benchmarks/scale_step.py's GRPO config and reading a plan's parts in GiB."""

from __future__ import annotations

from omegaconf import OmegaConf

from trainer.config_loader import load_config
from trainer.memory_plan import build_plan

GIB = 1 << 30
QWEN_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)
QWEN_3B = dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, intermediate_size=11008, tie_word_embeddings=True)


def scale_config(model: str, *extra: str, lora_rank: int = 0):
    """The GRPO setup of benchmarks/scale_step.py: 8 prompts x 8 responses x 512 tokens on one GPU."""
    cfg = load_config([
        f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=1", "data.max_prompt_length=96",
        "data.max_response_length=512", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.old_log_prob_pass=always", *extra,  # the pass's row is checked too
    ])
    if lora_rank:  # the key of the LoRA branch; set directly so this works before and after it exists
        OmegaConf.update(cfg, "actor_rollout_ref.model.lora_rank", lora_rank, force_add=True)
    return cfg


def plan_of(cfg, gib: float | None = 139.8):
    return build_plan(cfg, int(gib * GIB) if gib else None)


def part(plan, phase: str, column: str) -> float:
    return plan.row(phase).parts[column] / GIB


def logits_part(plan, phase: str) -> float:
    """GiB of logits at the phase's moment that holds them (an update's forward/backward, not its optimizer step)."""
    return max(r.parts["logits"] for g in plan.groups for r in g.rows if r.phase == phase) / GIB
