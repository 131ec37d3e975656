"""A mixture of experts' LoRA adapter in vLLM: the trainer's fused-expert factors handed over as they are.

transformers holds a Qwen3-MoE layer's experts as two fused tensors (`mlp.experts.gate_up_proj` [E, 2F, H], gate
rows first, and `mlp.experts.down_proj` [E, H, F]); PEFT adapts each with one A/B pair that holds every expert's
factors (its ParamWrapper; rank 2r for gate_up, so gate and up share each expert's A, and r for down), saved as
`...mlp.experts.base_layer.lora_{A,B}` (gate_up) and `...mlp.experts.lora_{A,B}` (down). vLLM (0.26 and later)
splits such "3D" factors into its per-expert gate, up and down slices itself, exactly, when the engine runs with
`enable_mixed_moe_lora_format` and the adapter is marked `is_3d_lora_weight`. Its rank slot must then hold 2r.
"""

from __future__ import annotations

from pathlib import Path

from workers.lora.spec import LoraSpec
from workers.moe_config import model_has_experts

# Module names that make PEFT adapt the fused experts (transformers 5's names and the per-expert ones it maps).
EXPERT_TARGETS = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up_proj", "experts"})
FUSED_EXPERT_MODEL_TYPES = ("qwen3_moe",)  # fused gate-then-up experts that vLLM's split reads the same way
_EXPERTS = ".mlp.experts"
_GATE_UP = _EXPERTS + ".base_layer"  # PEFT nests the gate_up wrapper inside the down_proj one


def _names(value: str | tuple[str, ...] | None) -> set[str]:
    if value is None:
        return set()
    return {value} if isinstance(value, str) else set(value)


def adapts_experts(spec: LoraSpec) -> bool:
    """Whether the adapter's target modules take a mixture of experts' experts (all-linear does)."""
    targets = _names(spec.target_modules) - _names(spec.exclude_modules)
    return spec.target_modules == "all-linear" or bool(targets & EXPERT_TARGETS)


def fused_expert_model_type(model_path: str | Path) -> str | None:
    """The model's `model_type` when it is a mixture of experts (None for a dense model)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path))
    return (getattr(config, "text_config", None) or config).model_type if model_has_experts(config) else None


def adapts_fused_experts(spec: LoraSpec | None, model_path: str | Path) -> bool:
    """Whether this run's adapter holds fused expert factors, in a layout vLLM splits, for the engine at
    `model_path`."""
    return spec is not None and adapts_experts(spec) and fused_expert_model_type(model_path) in FUSED_EXPERT_MODEL_TYPES


def module_kind(module_name: str) -> str:
    """The kind of module an adapter entry adapts, as vLLM names its LoRA layers (`q_proj`, `experts`, ...)."""
    if module_name.endswith(_GATE_UP):
        return "experts"
    return module_name.rsplit(".", 1)[-1]


def has_fused_expert_factors(module_names: list[str]) -> bool:
    return any(name.endswith((_EXPERTS, _GATE_UP)) for name in module_names)
