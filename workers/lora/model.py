"""LoRA adapters on a Hugging Face model, through transformers' PEFT integration (peft's LoRA layers).

The model stays the HF class it was (`model.add_adapter`), not a `PeftModel` wrapper: FSDP2's root unit,
HF `generate`, packed attention and gradient checkpointing see the same module tree as without LoRA; the
adapted linears become peft `LoraLayer`s holding `base_layer` plus the `lora_A`/`lora_B` factors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from workers.lora.compat import installed_peft_problem
from workers.lora.spec import ADAPTER_NAME, LoraSpec, is_adapter_parameter


def add_lora_adapters(model: nn.Module, spec: LoraSpec, seed: int = 0) -> None:
    """Inject the adapter (A random, B zero: the model computes what it did) and freeze everything else.

    The random A factors come from `seed` alone (the trainer passes `trainer.seed`): peft draws them from
    the global RNG, which is seeded here and restored afterwards, so every rank of an FSDP actor and every
    run with that seed start from the same adapter, whatever the RNG had been used for before.
    """
    # transformers raises ValueError for a peft it does not accept too; checked first so that it is never
    # reported as a target_modules problem (the driver checks the same before Ray starts).
    incompatible = installed_peft_problem()
    if incompatible:
        raise ImportError(incompatible)
    from peft.tuners.tuners_utils import cast_adapter_dtype

    model.requires_grad_(False)
    # manual_seed reseeds every initialised CUDA device too: restore them all, not only the CPU's RNG.
    cuda_devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(seed)
            model.add_adapter(spec.peft_config(), adapter_name=ADAPTER_NAME)
    except ValueError as error:  # peft: no module matched target_modules (minus exclude_modules)
        raise ValueError(
            f"actor_rollout_ref.model.target_modules={spec.target_modules!r} "
            f"(exclude_modules={spec.exclude_modules!r}) selects no layer of {type(model).__name__} for LoRA: {error}"
        ) from None
    # Float32 adapter factors (the optimizer's master weights) under a half-precision frozen base.
    cast_adapter_dtype(model, ADAPTER_NAME)
    if not adapter_parameter_names(model):
        raise ValueError(
            f"LoRA added no adapter factors to {type(model).__name__} (target_modules={spec.target_modules!r})"
        )
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_parameter(name))


def adapter_parameter_names(model: nn.Module) -> list[str]:
    """The adapter factors' parameter names, in `named_parameters` order (what a LoRA weight sync sends)."""
    return [name for name, _ in model.named_parameters() if is_adapter_parameter(name)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model inside the block (every LoRA layer skips its adapter), the adapted one after it."""
    model.disable_adapters()
    try:
        yield
    finally:
        model.enable_adapters()
