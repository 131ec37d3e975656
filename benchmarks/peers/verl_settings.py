"""The verl 0.9 `main_ppo` command line matched to `benchmarks/e2e_step.py` (GRPO, 0.5B, one GPU, hybrid vLLM).

Every setting of our side (benchmarks/gpu_grpo_step.py `grpo_overrides` + e2e_step's vLLM engine overrides +
the toolkit's defaults) is named here explicitly, so a verl default that differs cannot slip in. Keys where
verl's default already equals ours are still spelled out when they change the work done per step.
"""

from __future__ import annotations

from pathlib import Path


def verl_overrides(model: Path, train: Path, val: Path, work: Path, steps: int) -> list[str]:
    reward_file = Path(__file__).resolve().parent / "verl_reward.py"
    return [
        # data: 16 prompts x 96/256 tokens, the same parquet and model folder (its tokenizer) as ours
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=16",
        "data.max_prompt_length=96", "data.max_response_length=256", "data.truncation=error",
        "data.filter_overlong_prompts=false", "data.prompt_key=prompt", "data.shuffle=true", "data.seed=0",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",  # verl's default is true, ours false
        # verl's defaults, flash_attention_2 on packed sequences, need the flash_attn package, which PyPI has only
        # as source (no wheel for torch 2.11 + CUDA 13; a build takes hours). Both sides therefore run padded
        # batches through PyTorch SDPA, which is what ours does by default.
        "actor_rollout_ref.model.use_remove_padding=false", "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # GRPO with the KL term as a loss (algorithm/grpo.yaml of the toolkit)
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "algorithm.norm_adv_by_std_in_grpo=true",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2", "actor_rollout_ref.actor.ppo_epochs=1",
        # actor: FSDP2, one optimizer step of 16 prompts x 8 per step, micro-batches of 16, AdamW lr 1e-6, no decay
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32", "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        # rollout: hybrid vLLM on the same GPU, 8 samples, CUDA graphs, 0.4 of the GPU, sleep between phases
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.do_sample=true",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "actor_rollout_ref.rollout.enforce_eager=false",
        "actor_rollout_ref.rollout.free_cache_engine=true", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        # reward: the toolkit's arithmetic scorer
        f"reward.custom_reward_function.path={reward_file}", "reward.custom_reward_function.name=compute_score",
        # schedule: one GPU, N steps, no validation or checkpoints, metrics to the console and a JSONL file
        "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.device=cuda", f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", "trainer.logger=[console,file]", "trainer.project_name=peers",
        "trainer.experiment_name=verl_grpo", f"trainer.default_local_dir={work / 'verl_ckpt'}",
    ]
