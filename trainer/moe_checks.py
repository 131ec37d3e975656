"""A LoRA run of a mixture-of-experts model with vLLM rollouts, checked before Ray starts.

vLLM takes a LoRA adapter per expert module, while the trainer (PEFT over transformers 5's fused experts) adapts
each layer's experts as one fused weight: `target_modules=all-linear`, which takes the experts, cannot be synced.
And vLLM's CPU backend runs a mixture of experts with an adapter only through its Triton kernels, which need a GPU.
"""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.memory_plan.moe import expert_count
from trainer.memory_plan.shape import language_model_config, read_model_config
from trainer.run_setup import runs_on_gpu, visible_gpu_count

ATTENTION_AND_ROUTER = "[q_proj,k_proj,v_proj,o_proj,gate]"


def has_experts(model_path: str) -> bool:
    return expert_count(language_model_config(read_model_config(model_path))) > 0


def moe_lora_rollout_problem(cfg: DictConfig) -> str | None:
    """Why this LoRA run of a mixture of experts cannot sync its adapter into vLLM, or None."""
    model, rollout = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout
    if not model.lora_rank or rollout.name != "vllm" or not has_experts(model.path):
        return None
    lora = f"actor_rollout_ref.model.lora_rank={model.lora_rank} on the mixture of experts {model.path!r}"
    if not runs_on_gpu(str(cfg.trainer.device), visible_gpu_count()):
        return (
            f"{lora} with rollout.name=vllm needs a GPU: vLLM's CPU backend runs experts under a LoRA adapter only "
            "through its Triton kernels; use actor_rollout_ref.rollout.name=hf on CPU"
        )
    if str(model.target_modules) == "all-linear":
        return (
            f"{lora} adapts every linear layer, the experts too, which the trainer holds as one fused weight per layer "
            "and vLLM takes only per expert: set actor_rollout_ref.model.target_modules to the attention and the "
            f"router, e.g. {ATTENTION_AND_ROUTER}, or use actor_rollout_ref.rollout.name=hf"
        )
    return None
