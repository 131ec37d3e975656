"""Exporting a LoRA-trained FSDP model: the merged model as an HF folder, and the adapter alone in PEFT's format.

    path/                     config.json, model.safetensors (W + scaling * B @ A under the base names), tokenizer
    path/lora_adapter/        adapter_config.json + adapter_model.safetensors: `PeftModel.from_pretrained(base, it)`
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.fsdp.checkpoint import full_state_dict_on_rank0, save_hf_folder
from workers.lora.spec import ADAPTER_NAME, LoraSpec, is_adapter_parameter, peft_tensor_name

ADAPTER_SUBDIR = "lora_adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_BASE = ".base_layer."


def _unwrapped(name: str) -> str:
    """A base tensor's name without PEFT's wrappers (nested ones too: `experts.base_layer.base_layer.down_proj`)."""
    while _BASE in name:
        name = name.replace(_BASE, ".")
    return name


def merged_state(
    state: dict[str, torch.Tensor], spec: LoraSpec, deltas: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """HF names -> tensors of the model with each adapter folded into its base weight (in the base's dtype).
    `deltas` (`wrapped_parameter_deltas`) holds the adapters on bare parameters, by their base tensors' names."""
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if is_adapter_parameter(name):
            continue
        if deltas and name in deltas:
            merged[_unwrapped(name)] = (tensor.float() + deltas[name].float()).to(tensor.dtype)
            continue
        if _BASE not in name:
            merged[name] = tensor
            continue
        prefix, leaf = name.split(_BASE)
        if leaf == "weight":
            a = state[f"{prefix}.lora_A.{ADAPTER_NAME}.weight"].float()
            b = state[f"{prefix}.lora_B.{ADAPTER_NAME}.weight"].float()
            tensor = (tensor.float() + spec.scaling * (b @ a)).to(tensor.dtype)
        merged[f"{prefix}.{leaf}"] = tensor
    return merged


def wrapped_parameter_deltas(
    model: nn.Module, state: dict[str, torch.Tensor], spec: LoraSpec, auto_class: Any
) -> dict[str, torch.Tensor]:
    """PEFT's adapters on bare parameters rather than linear layers (`ParamWrapper`: a mixture of experts' fused
    expert weights and its router) as deltas, by their base tensors' names in `state`. Their factors are laid out
    PEFT's way per wrapped tensor, so PEFT computes the deltas, on a copy of the model built on the meta device
    whose tensors are `state`'s (nothing is allocated twice). Empty for a model without such adapters."""
    from peft.tuners.lora.layer import ParamWrapper

    if not any(isinstance(module, ParamWrapper) for module in model.modules()):
        return {}
    with torch.device("meta"):
        copy_of = auto_class.from_config(copy.deepcopy(model.config))
    copy_of.add_adapter(spec.peft_config(), adapter_name=ADAPTER_NAME)
    copy_of.load_state_dict(state, strict=True, assign=True)
    names = {id(param): name for name, param in copy_of.named_parameters()}
    deltas = {}
    for module in copy_of.modules():
        if isinstance(module, ParamWrapper):
            base = getattr(module.get_base_layer(), module.parameter_name)
            deltas[names[id(base)]] = module.get_delta_weight(ADAPTER_NAME).detach()
    return deltas


def untie_adapted_head(merged: dict[str, torch.Tensor], config: Any) -> None:
    """An adapter on a tied LM head changes the head but not the input embedding: the merged model keeps
    both, so its config must stop tying them (or loading it would drop the merged head)."""
    head, embedding = merged.get("lm_head.weight"), merged.get("model.embed_tokens.weight")
    tied = getattr(config, "tie_word_embeddings", False) and head is not None and embedding is not None
    if tied and not torch.equal(head, embedding):
        config.tie_word_embeddings = False


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter factors under PEFT's saved names."""
    return {peft_tensor_name(name): tensor.contiguous() for name, tensor in state.items() if is_adapter_parameter(name)}


def save_adapter_folder(state: dict[str, torch.Tensor], spec: LoraSpec, path: str, base_model_path: str) -> None:
    """PEFT's adapter folder: `adapter_config.json` (naming the base model) and `adapter_model.safetensors`."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config = spec.peft_config()
    config.base_model_name_or_path = base_model_path
    config.save_pretrained(path)
    save_file(adapter_state(state), os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})


def export_lora_hf(model: nn.Module, auto_class: Any, path: str, source_path: str, rank: int, spec: LoraSpec) -> None:
    """Collective: rank 0 writes the merged model into `path` and the adapter into `path/lora_adapter`."""
    state = full_state_dict_on_rank0(model)
    if rank == 0:
        base = os.path.abspath(source_path) if os.path.isdir(source_path) else source_path  # a local folder or a hub id
        save_adapter_folder(state, spec, os.path.join(path, ADAPTER_SUBDIR), base)
        deltas = wrapped_parameter_deltas(model, state, spec, auto_class)
        merged, config = merged_state(state, spec, deltas), copy.deepcopy(model.config)
        untie_adapted_head(merged, config)
        save_hf_folder(merged, auto_class, config, path, source_path)
    dist.barrier()  # callers may read the export as soon as any rank returns
