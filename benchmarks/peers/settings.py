"""The GRPO settings both sides of the CPU comparison share, and how each side spells them.

One `MatchedGRPO` value is turned into `trainer.main` overrides and into TRL `GRPOConfig` keyword
arguments, so a setting cannot differ between the two by a typo. The defaults are `trainer.main`'s own
(trainer/config/trainer.yaml, algorithm/grpo.yaml); the test/checkpoint schedule is switched off on our
side because TRL's run below has none either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MatchedGRPO:
    prompts_per_step: int = 16
    generations: int = 8
    max_prompt_length: int = 64
    max_response_length: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 2e-3
    kl_beta: float = 1e-3          # KL to the reference as a loss term (k3 / low_var_kl estimator on both sides)
    clip_ratio: float = 0.2
    prompts_per_update: int = 8    # one optimizer step per 8 prompts x 8 samples = 64 responses
    micro_batch: int = 32          # responses per forward/backward on one process
    grad_clip: float = 1.0
    steps: int = 60                # rollout steps (TRL counts optimizer steps: 2 per rollout step here)
    seed: int = 0

    @property
    def updates_per_step(self) -> int:
        return self.prompts_per_step // self.prompts_per_update

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ours_overrides(s: MatchedGRPO, model: Path, train: Path, val: Path, out_dir: Path, workers: int) -> list[str]:
    """`python -m trainer.main` overrides for `s` with `workers` FSDP processes (HF generate rollout)."""
    return [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        f"trainer.default_local_dir={out_dir}", f"trainer.n_gpus_per_node={workers}", "trainer.device=cpu",
        f"trainer.total_training_steps={s.steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.logger=[jsonl]", f"trainer.seed={s.seed}", f"data.seed={s.seed}",
        f"data.train_batch_size={s.prompts_per_step}", f"actor_rollout_ref.rollout.n={s.generations}",
        f"data.max_prompt_length={s.max_prompt_length}", f"data.max_response_length={s.max_response_length}",
        f"actor_rollout_ref.rollout.temperature={s.temperature}", f"actor_rollout_ref.rollout.top_p={s.top_p}",
        "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.actor.optim.lr={s.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_coef={s.kl_beta}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "algorithm.norm_adv_by_std_in_grpo=true",
        f"actor_rollout_ref.actor.clip_ratio_low={s.clip_ratio}", f"actor_rollout_ref.actor.clip_ratio_high={s.clip_ratio}",
        "actor_rollout_ref.actor.ppo_epochs=1", f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts_per_update}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s.micro_batch}",
        f"actor_rollout_ref.actor.grad_clip={s.grad_clip}", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0.0", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    ]


def trl_config_kwargs(s: MatchedGRPO, out_dir: Path) -> dict[str, Any]:
    """`trl.GRPOConfig` arguments for `s` on one CPU process.

    TRL's unit of a "step" is an optimizer step over `per_device_train_batch_size x
    gradient_accumulation_steps` responses; generation happens once every `steps_per_generation` micro-steps.
    So: micro-batch 32, 2 accumulation steps (= 64 responses per optimizer step, our mini-batch of 8
    prompts), and a generation of 128 responses every 4 micro-steps (= our 16 prompts x 8 per step).
    """
    responses_per_update = s.prompts_per_update * s.generations
    responses_per_step = s.prompts_per_step * s.generations
    return dict(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=s.seed, data_seed=s.seed, dataloader_num_workers=0,
        per_device_train_batch_size=s.micro_batch, gradient_accumulation_steps=responses_per_update // s.micro_batch,
        steps_per_generation=responses_per_step // s.micro_batch, num_generations=s.generations,
        max_steps=s.steps * s.updates_per_step, num_iterations=1,
        max_completion_length=s.max_response_length, temperature=s.temperature, top_p=s.top_p, top_k=0,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=s.grad_clip,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch",
        beta=s.kl_beta, epsilon=s.clip_ratio, scale_rewards="group", loss_type="dapo",
        gradient_checkpointing=False, log_completions=False,
    )
