"""Device and dtype choice, and loading an HF model sharded with FSDP2 (per decoder layer, workers/fsdp/wrap.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig

from workers.checkpointed_layers import kept_layers
from workers.dtypes import COMPUTE_DTYPES
from workers.fsdp.shared_base import row_parallel_placement
from workers.fsdp.wrap import shard_in_units
from workers.head_log_probs import set_logits_chunk_tokens
from workers.liger_kernels import apply_liger_kernels
from workers.lora.model import add_lora_adapters
from workers.lora.spec import LoraSpec
from workers.packing.forward import enable_packing
from workers.vision.models import language_model, vision_units


def worker_device() -> torch.device:
    """cuda:<current device> when a GPU is visible (the process group set it from local_rank), else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype forward passes run in; "auto" is bfloat16 on GPU and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"dtype {name!r} is not valid; valid: {['auto', *COMPUTE_DTYPES]}")
    return getattr(torch, name)


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """Decoder layers of an HF model: the units sharded (and all-gathered) one at a time."""
    bases = (
        getattr(model, getattr(model, "base_model_prefix", ""), None),
        getattr(model, "model", None),
        model,
        language_model(model),
    )
    for base in bases:
        layers = getattr(base, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError(f"cannot find the decoder layers (a `layers` ModuleList) of {type(model).__name__}")


def enable_gradient_checkpointing(model: nn.Module, recompute_layers: int | None) -> None:
    """Recompute the first `recompute_layers` decoder layers in backward (None: all of them); the later layers
    keep their activations, trading memory for the recompute's forward (a third of the update's FLOPs when all
    recompute). The first ones recompute because their activations would be held longest."""
    # Non-reentrant checkpointing works with FSDP2's per-layer all-gathers in recomputation.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if recompute_layers is None:
        return
    layers = transformer_layers(model)
    for layer in layers[len(layers) - kept_layers(recompute_layers, len(layers)) :]:
        layer.gradient_checkpointing = False  # transformers' GradientCheckpointingLayer reads this per call


def load_sharded_model(
    auto_class: Any,
    model_cfg: dict[str, Any],
    device: torch.device,
    trainable: bool,
    config_overrides: dict[str, Any] | None = None,
    seed: int = 0,
    lora: LoraSpec | None = None,
    shard_size: int = -1,
    row_parallel_base: bool = False,
) -> nn.Module:
    """`auto_class.from_pretrained(path)` sharded with FSDP2 (`shard_in_units`) over all ranks, or within groups of
    `shard_size` ranks (hybrid sharding, `fsdp_config.fsdp_size`): float32 master
    parameters when trainable, the compute dtype when frozen. With `lora` (trainable models) the base weights are
    frozen in the compute dtype and only the float32 adapter factors train. `seed` is set before loading so heads
    missing from the checkpoint (a new value or score head) get the same initial values on every rank; LoRA's random
    A factors are drawn from `seed` itself (`add_lora_adapters`), the same on every rank and in every run with that
    seed. `row_parallel_base`: the frozen base is sharded as a tensor-parallel engine over the shard group holds it
    (workers/fsdp/shared_base.py, `row_parallel_placement`), to be shared with that engine.
    """
    dtype = compute_dtype(model_cfg["dtype"], device)
    load_dtype = torch.float32 if trainable and lora is None else dtype
    # Overrides go onto the config object: from_pretrained would hand unknown config keys to __init__.
    config = AutoConfig.from_pretrained(model_cfg["path"])
    for key, value in {**(model_cfg.get("override_config") or {}), **(config_overrides or {})}.items():
        setattr(config, key, value)
    kwargs: dict[str, Any] = {"dtype": load_dtype, "config": config}
    if model_cfg["attn_implementation"] is not None:
        kwargs["attn_implementation"] = model_cfg["attn_implementation"]
    torch.manual_seed(seed)
    model = auto_class.from_pretrained(model_cfg["path"], **kwargs)
    if model_cfg.get("use_liger"):
        apply_liger_kernels(model, device)
    if trainable and model_cfg["enable_gradient_checkpointing"]:
        enable_gradient_checkpointing(model, model_cfg.get("gradient_checkpointing_layers"))
    text_config = model.config.get_text_config()  # the config itself, or a vision-language model's text part
    if getattr(text_config, "pad_token_id", None) is None and getattr(text_config, "eos_token_id", None) is not None:
        eos = text_config.eos_token_id
        text_config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    model.requires_grad_(trainable)
    if trainable and lora is not None:
        add_lora_adapters(model, lora, seed)
    enable_packing(model, model_cfg["use_remove_padding"])
    if "logits_chunk_tokens" in model_cfg:  # the actor's and reference's setting (an LM head)
        set_logits_chunk_tokens(model, model_cfg["logits_chunk_tokens"])

    # A frozen model was loaded in the compute dtype: no cast on gather.
    units = transformer_layers(model) + vision_units(model)
    placement = row_parallel_placement(model) if row_parallel_base else None
    shard_in_units(model, units, device, dtype if trainable else None, shard_size, placement)
    # FSDP2's lazy init, which its first forward would run, is run now, for two reasons:
    # - it fixes each unit's gradient dtypes from the parameters that require grad at that moment, and peft's
    #   disable_adapters clears requires_grad: a first forward with the adapters off (a LoRA actor's reference
    #   pass, the first forward when the old log-prob pass is skipped) left every adapter gradient in the
    #   compute dtype, which the float32 factors refuse in the first backward;
    # - it takes the first unit to run forward as the root, and HF generate runs a vision tower first.
    model._get_fsdp_state()._lazy_init()
    model.train(trainable)
    return model
