"""Turning a meta-device module shipped from the driver into a loaded, FSDP2-sharded module on a worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from workers.fsdp.wrap import shard_in_units, units_by_class


def clear_stale_requires_grad(module: nn.Module) -> None:
    """Make pickling keep each parameter's `requires_grad` (call on the driver before shipping).

    Under `accelerate.init_empty_weights` a parameter registered a second time (transformers tying the LM
    head to the input embedding) keeps `requires_grad` in its instance `__dict__`, as it was then. Nothing
    reads that entry (the tensor's own flag wins) until the module is pickled: unpickling restores the
    `__dict__` and with it the stale flag, so an embedding that peft had frozen arrived trainable on the
    workers, and the LoRA example trained the tied embedding / LM head too."""
    for param in module.parameters():
        param.__dict__.pop("requires_grad", None)


def _source_tensors(module: Any, folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's tensors under the names the module's class uses. For Hugging Face models the class's
    own loader reads the folder: it applies the renames between checkpoint and module layouts (e.g. a
    Qwen2-VL checkpoint's `model.layers.*` are the module's `model.language_model.layers.*`)."""
    from transformers import PreTrainedModel

    if isinstance(module, PreTrainedModel):
        base_class = next(
            c
            for c in type(module).__mro__
            if issubclass(c, PreTrainedModel) and c.__module__.startswith("transformers.")
        )
        yield from base_class.from_pretrained(str(folder), dtype=torch.float32).state_dict().items()
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"materialization source {folder} holds no *.safetensors files")
    for file in files:
        yield from load_file(str(file)).items()


def fill_from_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Set a (possibly FSDP2-sharded) parameter from its full value, e.g. in `on_weights_materialized`. Every
    rank passes the same `full` (drawn from a seeded generator, say) and keeps its own shard of it, so the
    ranks agree without communicating."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"full tensor of shape {tuple(full.shape)} for a parameter of shape {tuple(param.shape)}")
    full = full.to(device=param.device, dtype=param.dtype)
    if isinstance(param, DTensor):
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    with torch.no_grad():
        param.copy_(full)


def materialize(module: Any, device: torch.device, compute_dtype: torch.dtype) -> list[str]:
    """Allocate, tie, load and shard `module` (fp32 master weights); returns the missing parameter names."""
    # Real (uninitialised) float32 storage for every meta parameter; buffers, which `init_empty_weights` keeps
    # real (rotary frequencies and the like), are moved as they are.
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.is_meta:
                sub._parameters[name] = nn.Parameter(
                    torch.empty(param.shape, dtype=torch.float32, device=device), param.requires_grad
                )
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = buffer.to(device)
    if hasattr(module, "tie_weights"):
        module.tie_weights()  # pickling dropped the embedding / LM-head tie
    # The weights of `module.materialization_source()`, through the input hook.
    own = dict(module.named_parameters())
    loaded: set[str] = set()
    with torch.no_grad():
        for name, tensor in _source_tensors(module, Path(module.materialization_source())):
            name, tensor = module.preprocess_input_named_parameters(name, tensor)
            if name in own:
                own[name].copy_(tensor.to(device))
                loaded.add(name)
    shard_in_units(module, units_by_class(module, module.non_split_modules), device, compute_dtype)
    return sorted(set(own) - loaded)
