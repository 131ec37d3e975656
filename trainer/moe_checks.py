"""A LoRA run of a mixture-of-experts model with vLLM rollouts, checked before Ray starts.

vLLM's CPU backend runs a mixture of experts with an adapter only through its Triton kernels, which need a GPU.
The trainer (PEFT over transformers 5's fused experts) adapts each layer's experts as one fused weight; vLLM
splits those factors per expert itself (workers/lora/moe_vllm.py), a split checked here for Qwen3-MoE only.
"""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.memory_plan.moe import expert_count
from trainer.memory_plan.shape import language_model_config, read_model_config
from trainer.run_setup import runs_on_gpu, visible_gpu_count
from workers.lora.moe_vllm import FUSED_EXPERT_MODEL_TYPES, adapts_experts
from workers.lora.spec import LoraSpec

ATTENTION_AND_ROUTER = "[q_proj,k_proj,v_proj,o_proj,gate]"


def moe_lora_rollout_problem(cfg: DictConfig) -> str | None:
    """Why this LoRA run of a mixture of experts cannot sync its adapter into vLLM, or None."""
    model, rollout = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout
    if not model.lora_rank or rollout.name != "vllm":
        return None
    model_config = language_model_config(read_model_config(model.path))
    if expert_count(model_config) == 0:
        return None
    lora = f"actor_rollout_ref.model.lora_rank={model.lora_rank} on the mixture of experts {model.path!r}"
    if not runs_on_gpu(str(cfg.trainer.device), visible_gpu_count()):
        return (
            f"{lora} with rollout.name=vllm needs a GPU: vLLM's CPU backend runs experts under a LoRA adapter only "
            "through its Triton kernels; use actor_rollout_ref.rollout.name=hf on CPU"
        )
    model_type = model_config.get("model_type")
    spec = LoraSpec.from_model_config(model)
    if spec is not None and adapts_experts(spec) and model_type not in FUSED_EXPERT_MODEL_TYPES:
        return (
            f"{lora} adapts the experts of a {model_type!r} model; their adapter reaches vLLM only for "
            f"{list(FUSED_EXPERT_MODEL_TYPES)}: set actor_rollout_ref.model.target_modules to the attention and the "
            f"router, e.g. {ATTENTION_AND_ROUTER}, or use actor_rollout_ref.rollout.name=hf"
        )
    return None
