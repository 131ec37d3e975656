"""The GRPO settings every side of the GPU comparison shares, and the sides themselves.

One `GpuGRPO` value feeds our `benchmarks.e2e_step` overrides, verl's command line (`verl_settings.py`) and TRL's
`GRPOConfig` (`trl_gpu.py`), so a setting cannot differ between sides by a typo. The defaults (preset
`0.5b-1gpu`) are exactly `benchmarks/gpu_grpo_step.py:grpo_overrides` plus e2e_step's vLLM engine overrides
(checked by a test), with EOS ignored on every side so that every response is `max_response_length` tokens
long: with a random-init model one framework's engine may stop early at an EOS and another's not, and then the
sides do different work. `PRESETS` names the comparisons: `7b-2gpu` is the Qwen2.5-7B-shaped one on two GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.peers.settings import MatchedGRPO

SIDES = ("ours_packed", "ours_padded", "trl", "verl")
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
    size: str = "0.5B"              # the model shape (benchmarks/e2e_step.py SHAPES)
    gpus: int = 1                   # trainer.n_gpus_per_node on every side: FSDP over them, one hybrid engine each
    gradient_checkpointing: bool = False

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.generations

    def tiny(self) -> "GpuGRPO":
        """The same run shrunk for a CPU dry run: the tiny shape, short responses, prompts within the tiny model's
        positions, at most 16 prompts per step; the workers, micro-batches and switches as on the GPU."""
        prompts = min(self.prompts_per_step, 16)
        return replace(self, size="tiny", max_response_length=32, max_prompt_length=min(self.max_prompt_length, 96),
                       prompts_per_step=prompts, prompts_per_update=min(self.prompts_per_update, prompts))


@dataclass(frozen=True)
class Preset:
    """One comparison: its settings, the sides that run (in this order by default) and each side's time limit."""

    settings: GpuGRPO
    limits_s: dict[str, float]
    why_not: dict[str, str]  # a side this preset cannot run -> why
    ours_extra: tuple[str, ...] = ()  # overrides of our sides only (before --ours-extra's)

    @property
    def sides(self) -> tuple[str, ...]:
        return tuple(self.limits_s)


PRESETS = {
    # Time limits from the 2026-11-24 H100 runs: ours 5 steps in 1.5-2 min with start-up; verl's legacy trainer
    # ran 4 steps inside a 380 s limit, and with ignore_eos its steps 2-4 took 15-19 s (start-up: Ray, the FSDP
    # workers, the vLLM server); TRL 3 steps in 94 s (2026-11-25).
    "0.5b-1gpu": Preset(GpuGRPO(), {"ours_padded": 180.0, "verl": 420.0, "ours_packed": 180.0, "trl": 240.0}, {}),
    # The issue "[Side by side at 7B]": the Qwen2.5-7B shape on 2 GPUs, FSDP over both with nothing offloaded, a
    # hybrid vLLM engine (CUDA graphs) per GPU, 32 prompts x 8, 512/1024 tokens, one optimizer step per batch.
    # Gradient checkpointing on both sides: without it one 4-row micro-batch of 1536 tokens keeps ~38 GB of
    # activations beside 60 GB of float32 weights, gradients and Adam state per GPU. Micro-batches of 4 rows
    # (update) and 8 (log-probs) per GPU keep verl's full [tokens x vocabulary] logits (float32) under 8 GiB.
    # Limits: ours measured 9.7 s/step for 8 x 8 x 512 (packed, 2 H200s; 2.5-3.5 min for 2-3 steps with start-up);
    # this batch is ~7x the tokens, so an estimated 60-80 s/step and ~2 min to start: 3 steps in 5-7 min. verl's
    # start at 7B is not measured (0.5B: ~4 min); its steps were 4.6x ours at 0.5B, mostly fixed costs that weigh
    # less at 7B: 900 s.
    "7b-2gpu": Preset(
        GpuGRPO(size="7B", gpus=2, prompts_per_step=32, prompts_per_update=32, max_prompt_length=512, max_response_length=1024,
                micro_batch=4, log_prob_micro_batch=8, gradient_checkpointing=True, steps=3),
        {"verl": 900.0, "ours_padded": 540.0, "ours_packed": 480.0},
        {"trl": "TRL's GRPOTrainer runs in one process here (no accelerate launch): a 7B model's float32 weights, "
                "gradients and Adam state (~120 GB) do not fit one GPU beside its vLLM engine"},
    ),
}
# The item 5: the same run with FSDP over 4 GPUs (a hybrid engine on each), for tokens/s per GPU beside
# the 2-GPU figure; the per-GPU state halves, so it also fits H100s.
PRESETS["7b-4gpu"] = replace(PRESETS["7b-2gpu"], settings=replace(PRESETS["7b-2gpu"].settings, gpus=4))
# Bigger than 7B on four GPUs: the 7B run's batch and lengths, packed with a 16K-token update budget (the 7B
# run's best, docs/benchmarks.md). 14B full: FSDP over four, a hybrid TP1 engine per GPU (plan: 109 GiB per
# GPU of an H200). 32B full does not fit four H200s (plan: 168 GiB); 32B trains LoRA r64 over all linear layers
# with one TP2 hybrid engine per pair of GPUs, the base shared with it (plan at ac61bbc: 64 GiB). Limits:
# estimates from the 7B run (40 s steps packed, 2 min to start), ~2x and ~4x the FLOPs per token.
_BUDGET_16K = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768")
# Liger's fused RMSNorm, SwiGLU and rotary kernels: the update 39% -> 44% MFU on a 7B-shaped update on one H200.
_LIGER = ("actor_rollout_ref.model.use_liger=true",)
_NO_TRL = {"trl": "TRL's GRPOTrainer runs in one process here (no accelerate launch): no model above 7B fits it"}
PRESETS["14b-4gpu"] = Preset(
    replace(PRESETS["7b-2gpu"].settings, size="14B", gpus=4), {"ours_packed": 600.0}, _NO_TRL, (*_BUDGET_16K, *_LIGER)
)
# The same run on four 80 GB H100s. The plan (trainer.plan_only=true trainer.gpu_memory_gib=79.1): without offload
# the update peaks at 92.2 GiB per GPU; with the optimizer's state offloaded, 67.7 (its step). The H200's
# gpu_memory_utilization of 0.4 leaves each engine's cache 3 sequences after its weights and start-up profile
# (generation in waves); at 0.62 with max_num_seqs=64, the count a step gives each engine (vLLM's start-up profile
# then samples for 64 requests, not 1024), each engine's cache holds 68 sequences, all 64 at once, and the plan peaks
# at 75.0 GiB (generate).
PRESETS["14b-4gpu-h100"] = replace(
    PRESETS["14b-4gpu"],
    ours_extra=(*PRESETS["14b-4gpu"].ours_extra, "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.62", "actor_rollout_ref.rollout.max_num_seqs=64"),
)
PRESETS["32b-lora-4gpu"] = Preset(
    replace(PRESETS["7b-2gpu"].settings, size="32B", gpus=4), {"ours_packed": 900.0}, _NO_TRL,
    (*_BUDGET_16K, *_LIGER, "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=128",
     "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
     # FSDP shard groups of the engine's two ranks: a rank's base shards are its engine shard's (one copy of the base)
     "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
     # At the comparison's 0.4 each TP2 engine's KV cache holds ~124 of the 128 sequences it gets (the plan's
     # concurrency note): the last few would start when the first finish, doubling generation. 0.45 holds them all.
     "actor_rollout_ref.rollout.gpu_memory_utilization=0.45"),
)
DEFAULT_PRESET = "0.5b-1gpu"


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
        f"{a}.actor.use_dynamic_bsz=false", f"{a}.model.enable_gradient_checkpointing={str(s.gradient_checkpointing).lower()}",
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
    overrides = [*shared_overrides(s), f"trainer.seed={s.seed}", f"trainer.n_gpus_per_node={s.gpus}"]
    if side == "ours_padded":
        # Padded micro-batches through PyTorch SDPA (transformers' default attention for Qwen2): what verl runs
        # without the flash_attn package, and what TRL runs.
        overrides.append("actor_rollout_ref.model.use_remove_padding=false")
    return overrides
