"""The trainer's LoRA adapter inside vLLM, taken from tensors in memory (no adapter folder on disk).

vLLM loads adapters by path: per request, its worker's LoRA manager looks the adapter's id up in its cache
and reads `lora_path` only on a miss. So the engine side of a sync builds vLLM's `LoRAModel` from the
received tensors (`LoRAModel.from_lora_tensors`, the same call its folder loader ends in, with the same
name mapping and validation), replaces the cached adapter of our fixed id with it, and every generate then
names that id. The placeholder path is never read; a request reaching an engine that was not given the
adapter fails there with vLLM's "adapter not found" naming it. These are vLLM internals (the runner's
`lora_manager` and its `_adapter_manager`), present alike in vLLM 0.26 and 0.32.

The adapter is built and activated on the engine's device, then vLLM's copy of it (read again only to activate
it anew) moves to host memory. vLLM's own loader builds on the host and page-locks every factor, after
splitting a mixture of experts' fused factors per expert: tens of thousands of page-locked allocations a sync
at 30B-A3B. On the GPU the split is a few kernels, the activation a device-to-device copy, and the engine's
GPU keeps nothing beyond its adapter slots between syncs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workers.lora.host_copies import host_copies
from workers.lora.moe_vllm import has_fused_expert_factors, module_kind
from workers.lora.spec import LoraSpec, peft_tensor_name, vllm_rank_slot
from workers.rollout.verify import WeightFingerprint

ADAPTER_ID = 1  # one adapter per engine, replaced in place by every sync
ADAPTER_LABEL = "actor_lora"
ADAPTER_PATH = "in-memory:actor_lora (sent by the trainer's weight sync)"


def engine_options(spec: LoraSpec, fused_experts: bool = False) -> dict[str, Any]:
    """`LLM(...)` arguments of an engine serving the trainer's adapter. `fused_experts`: the adapter adapts a
    mixture of experts' fused experts (workers/lora/moe_vllm.py): vLLM splits them per expert itself, and their
    gate_up factors have rank 2r."""
    if not fused_experts:
        return {"enable_lora": True, "max_lora_rank": spec.vllm_max_lora_rank, "max_loras": 1}
    return {
        "enable_lora": True,
        "max_lora_rank": vllm_rank_slot(2 * spec.rank),  # the gate_up factors' rank
        "max_loras": 1,
        "enable_mixed_moe_lora_format": True,
    }


def adapter_request() -> Any:
    """The request naming the synced adapter (passed with every generate)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=ADAPTER_LABEL, lora_int_id=ADAPTER_ID, lora_path=ADAPTER_PATH)


def _name_mapper(model: Any) -> Any:
    """The model's HF -> vLLM renames, as vLLM's own adapter loader takes them (the method's name differs by
    vLLM version)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    for method in ("get_rename_mapper", "get_unstacked_mapper"):
        if mapper is not None and hasattr(mapper, method):
            return getattr(mapper, method)()
    return mapper


@dataclass(frozen=True)
class RegisteredAdapter:
    tensors: int  # how many tensors the sync sent
    fingerprint: float  # sum of |w| over the factors as the engine applies them (for sync checks)


def register_adapter(
    model_runner: Any, named_tensors: Iterable[tuple[str, torch.Tensor]], adapter_config: dict[str, Any]
) -> RegisteredAdapter:
    """Inside a vLLM worker: make `named_tensors` (trainer names of the adapter factors) the adapter that
    requests with `adapter_request()` use from now on."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = getattr(model_runner, "lora_manager", None)
    if manager is None:
        raise RuntimeError("this vLLM engine was started without LoRA (enable_lora); it cannot take an adapter")
    helper = PEFTHelper.from_dict(adapter_config)
    helper.validate_legal(manager.lora_config)
    dtype = manager.lora_config.lora_dtype
    device = engine_device(model_runner)
    adapters = manager._adapter_manager
    # The previous adapter goes first, so the GPU never holds two (a failed sync leaves none: requests then
    # fail naming the adapter, never run on a stale one).
    adapters.remove_adapter(ADAPTER_ID)  # also frees its slot
    # Copies: vLLM scales lora_B in place when it packs the adapter, and these may be the trainer's tensors.
    tensors = {
        peft_tensor_name(name): tensor.detach().to(device, dtype=dtype, copy=True) for name, tensor in named_tensors
    }
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=ADAPTER_ID,
        tensors=tensors,
        peft_helper=helper,
        device=str(device),
        dtype=dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=_name_mapper(adapters.model),
        skip_prefixes=getattr(adapters.model, "lora_skip_prefixes", None),
    )
    if has_fused_expert_factors(list(lora.loras)):
        if not getattr(manager.lora_config, "enable_mixed_moe_lora_format", False):
            raise RuntimeError(
                "the adapter holds fused expert factors, but this vLLM engine was started without "
                "enable_mixed_moe_lora_format (engine_options(spec, fused_experts=True) sets it)"
            )
        lora.is_3d_lora_weight = True  # vLLM splits them per expert when it packs the adapter
    # vLLM's LoRA layers of the model must cover every module the adapter adapts.
    supported = set()
    for module in adapters.supported_lora_modules:
        supported.update(adapters.packed_modules_mapping.get(module, [module]))
    unsupported = sorted(
        {module_kind(name) for name in lora.loras} - supported - set(adapters.packed_modules_mapping)
    )
    if unsupported:
        raise ValueError(
            f"vLLM cannot apply LoRA to {unsupported} of this model (it supports {sorted(supported)}); leave them out "
            "with actor_rollout_ref.model.exclude_modules"
        )
    count = len(tensors)
    del tensors  # vLLM's per-expert split then frees each fused factor as it goes
    adapters.add_adapter(lora)
    adapters.activate_adapter(ADAPTER_ID)  # into the slots now, from the GPU (a request would do it from the copy)
    # vLLM's copy to the host, fingerprinted on the way (tens of thousands of factors for a mixture of experts:
    # packed into a few copies, not one each).
    fingerprint = WeightFingerprint()
    on_host = iter(host_copies(list(lora_factors(lora)), fingerprint))
    for weights in lora.loras.values():
        weights.lora_a = _replaced(weights.lora_a, on_host)
        weights.lora_b = _replaced(weights.lora_b, on_host)
    return RegisteredAdapter(tensors=count, fingerprint=fingerprint.value)


def _replaced(factor: Any, replacements: Iterator[torch.Tensor]) -> Any:
    """`factor` (a tensor, None, or a list / tuple of them: one per packed module or expert) with each tensor
    replaced by the next of `replacements`, in `lora_factors`' order."""
    if isinstance(factor, (list, tuple)):
        return type(factor)(next(replacements) if part is not None else None for part in factor)
    return next(replacements) if factor is not None else None


def engine_device(model_runner: Any) -> torch.device:
    """The device the engine's model computes on (vLLM's CPU runner: the host)."""
    device = getattr(model_runner, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


def lora_factors(lora: Any) -> Iterator[torch.Tensor]:
    """Every factor tensor of a vLLM `LoRAModel` (packed modules and per-expert lists included)."""
    for weights in lora.loras.values():
        for factor in (weights.lora_a, weights.lora_b):
            for tensor in factor if isinstance(factor, (list, tuple)) else [factor]:
                if tensor is not None:
                    yield tensor
