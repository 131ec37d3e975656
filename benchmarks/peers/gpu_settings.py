"""The GRPO settings every side of the GPU comparison shares, and the sides themselves.

One `GpuGRPO` value feeds our `benchmarks.e2e_step` overrides, verl's command line (`verl_settings.py`) and TRL's
`GRPOConfig` (`trl_gpu.py`), so a setting cannot differ between sides by a typo. The defaults are exactly
`benchmarks/gpu_grpo_step.py:grpo_overrides` plus e2e_step's vLLM engine overrides (checked by a test), with
EOS ignored on every side so that every response is `max_response_length` tokens long: with a random-init model
one framework's engine may stop early at an EOS and another's not, and then the sides do different work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.peers.settings import MatchedGRPO

# Side -> default time limit (s) of its run. From the 2026-11-24 H100 runs: ours 5 steps in 1.5-2 min with
# start-up; verl's legacy trainer ran 4 steps inside a 380 s limit, and with ignore_eos its steps 2-4 took
# 15-19 s (start-up: Ray, the FSDP workers, the vLLM server); TRL's start (two fp32 models, vLLM with CUDA
# graphs) has no GPU figure yet.
SIDE_LIMITS_S = {"ours_packed": 180.0, "ours_padded": 180.0, "trl": 240.0, "verl": 420.0}
SIDES = tuple(SIDE_LIMITS_S)
# Which of our sides does the same work per step as each peer (both run padded batches through SDPA).
PAIRS = (("ours_padded", "verl"), ("ours_packed", "verl"), ("ours_padded", "trl"), ("ours_packed", "trl"))


@dataclass(frozen=True)
class GpuGRPO(MatchedGRPO):
    """The CPU comparison's settings (batch, sampling, KL, clip, grad clip, seed) with the GPU run's own."""

    max_prompt_length: int = 96
    max_response_length: int = 256
    lr: float = 1e-6
    prompts_per_update: int = 16   # one optimizer step per rollout step
    micro_batch: int = 16          # responses per forward/backward
    steps: int = 4
    # Not in the CPU comparison:
    ignore_eos: bool = True
    weight_decay: float = 0.0
    log_prob_micro_batch: int = 32  # responses per old/ref log-prob forward
    gpu_memory_utilization: float = 0.4

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.generations

    def tiny(self) -> "GpuGRPO":
        """The same run shrunk for a CPU dry run (short responses; everything else as on the GPU)."""
        return replace(self, max_response_length=32)


def shared_overrides(s: GpuGRPO) -> list[str]:
    """The overrides ours and verl spell alike (the toolkit uses verl's key names and meanings)."""
    a = "actor_rollout_ref"
    return [
        f"data.train_batch_size={s.prompts_per_step}", f"{a}.rollout.n={s.generations}",
        f"data.max_prompt_length={s.max_prompt_length}", f"data.max_response_length={s.max_response_length}",
        f"{a}.rollout.ignore_eos={str(s.ignore_eos).lower()}", f"{a}.rollout.temperature={s.temperature}",
        f"{a}.rollout.top_p={s.top_p}", f"{a}.rollout.gpu_memory_utilization={s.gpu_memory_utilization}",
        f"{a}.actor.optim.lr={s.lr}", f"{a}.actor.optim.weight_decay={s.weight_decay}", f"{a}.actor.grad_clip={s.grad_clip}",
        f"{a}.actor.use_kl_loss=true", f"{a}.actor.kl_loss_coef={s.kl_beta}", f"{a}.actor.kl_loss_type=low_var_kl",
        f"{a}.actor.entropy_coeff=0", f"{a}.actor.loss_agg_mode=token-mean", f"{a}.actor.ppo_epochs=1",
        f"{a}.actor.clip_ratio_low={s.clip_ratio}", f"{a}.actor.clip_ratio_high={s.clip_ratio}",
        f"{a}.actor.ppo_mini_batch_size={s.prompts_per_update}", f"{a}.actor.ppo_micro_batch_size_per_gpu={s.micro_batch}",
        f"{a}.actor.use_dynamic_bsz=false", f"{a}.model.enable_gradient_checkpointing=false",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu={s.log_prob_micro_batch}",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu={s.log_prob_micro_batch}",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "algorithm.norm_adv_by_std_in_grpo=true",
        f"data.seed={s.seed}",
    ]


def ours_overrides(s: GpuGRPO, side: str) -> list[str]:
    """`benchmarks.e2e_step` overrides for `s` on our side `side` (ours_packed or ours_padded).

    Every value of `s` is spelled out (after e2e_step's own, so these win), which makes a CPU dry run with
    `s.tiny()` the same command with other numbers."""
    if side not in ("ours_packed", "ours_padded"):
        raise ValueError(f"our sides are ours_packed and ours_padded, got {side!r}")
    overrides = [*shared_overrides(s), f"trainer.seed={s.seed}"]
    if side == "ours_padded":
        # Padded micro-batches through PyTorch SDPA (transformers' default attention for Qwen2): what verl runs
        # without the flash_attn package, and what TRL runs.
        overrides.append("actor_rollout_ref.model.use_remove_padding=false")
    return overrides
