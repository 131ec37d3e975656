"""The verl 0.9 `main_ppo` command line matched to `benchmarks/e2e_step.py` (GRPO, 0.5B, one GPU, hybrid vLLM).

Every setting of our side (benchmarks/gpu_grpo_step.py `grpo_overrides` + e2e_step's vLLM engine overrides +
the toolkit's defaults, all in `gpu_settings.GpuGRPO`) is named here explicitly, so a verl default that differs
cannot slip in. Keys where verl's default already equals ours are still spelled out when they change the work
done per step. The keys both spell alike come from `gpu_settings.shared_overrides`; these are verl's own.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.peers.gpu_settings import GpuGRPO, shared_overrides


def verl_overrides(model: Path, train: Path, val: Path, work: Path, steps: int, s: GpuGRPO = GpuGRPO()) -> list[str]:
    reward_file = Path(__file__).resolve().parent / "verl_reward.py"
    a = "actor_rollout_ref"
    return [
        # batch, lengths, ignore_eos, sampling, GRPO + KL loss, clip, optimizer, micro-batches, seed: as ours
        *shared_overrides(s),
        # data: the same parquet and model folder (its tokenizer) as ours
        f"data.train_files={train}", f"data.val_files={val}", "data.truncation=error", "data.filter_overlong_prompts=false",
        "data.prompt_key=prompt", "data.shuffle=true", f"{a}.model.path={model}",
        # verl's defaults, flash_attention_2 on packed sequences, need the flash_attn package, which PyPI has only
        # as source (no wheel for torch 2.11 + CUDA 13; a build takes hours). verl therefore runs padded batches
        # through PyTorch SDPA, and pairs with our padded side (gpu_settings.PAIRS).
        f"{a}.model.use_remove_padding=false", f"+{a}.model.override_config.attn_implementation=sdpa",
        # actor: FSDP2 (ref follows), no offload
        f"{a}.actor.strategy=fsdp2", f"{a}.actor.fsdp_config.param_offload=false",
        f"{a}.actor.fsdp_config.optimizer_offload=false", f"{a}.ref.fsdp_config.param_offload=false",
        # rollout: hybrid vLLM on the same GPU, CUDA graphs, sleep between phases
        f"{a}.rollout.name=vllm", f"{a}.rollout.tensor_model_parallel_size=1", f"{a}.rollout.top_k=-1",
        f"{a}.rollout.do_sample=true", f"{a}.rollout.enforce_eager=false", f"{a}.rollout.free_cache_engine=true",
        # reward: the toolkit's arithmetic scorer
        f"reward.custom_reward_function.path={reward_file}", "reward.custom_reward_function.name=compute_score",
        # schedule: s.gpus GPUs (FSDP over them, a vLLM replica on each: tensor parallel 1), N steps, no validation
        # or checkpoints, metrics to the console and a JSONL file.
        # The legacy trainer: verl 0.9's default v1 trainer produced no step within 330 s on the H100 (2026-11-24).
        "trainer.use_v1=false", "trainer.nnodes=1", f"trainer.n_gpus_per_node={s.gpus}", "trainer.device=cuda",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.logger=[console,file]", "trainer.project_name=peers", "trainer.experiment_name=verl_grpo",
        f"trainer.default_local_dir={work / 'verl_ckpt'}",
    ]
