"""Forward passes of HF models on packed micro-batches, with outputs in the padded layout.

Same results as the padded functions of `workers/fsdp/sequences.py` (log-probs, entropies, values,
per-token head outputs) at every real position, computed without running the model on padding; padding
positions of the outputs hold 0. The model must use the packed attention (`enable_packing`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from protocol import DataProto
from workers.head_log_probs import token_log_probs_and_entropy
from workers.packing.attention import PACKED_PREFIX, packed_implementation
from workers.packing.layout import PackedRows, scatter_slots
from workers.vision.forward_inputs import packed_vision_inputs, vision_forward_inputs
from workers.vision.models import attention_setting

def supports_packing(model: nn.Module) -> bool:
    """Whether the model's layers call attention through transformers' attention interface (so the
    packed kernel, with its per-sequence offsets, can take their place)."""
    return bool(getattr(type(model), "_supports_attention_backend", False))


def enable_packing(model: nn.Module, use_remove_padding: bool | None) -> bool:
    """Switch the model to packed attention when asked (True) or by default where supported (None);
    returns whether packed forwards are on. Padded calls (generation) keep working unchanged."""
    if use_remove_padding is False:
        return False
    if not supports_packing(model):
        if use_remove_padding:
            raise ValueError(
                f"model.use_remove_padding=true: {type(model).__name__} does not call attention through "
                "transformers' attention interface, so it cannot run packed; set use_remove_padding=false"
            )
        return False
    model.set_attn_implementation(attention_setting(model, packed_implementation(model.config._attn_implementation)))
    return True


def is_packed(model: nn.Module) -> bool:
    return str(model.config._attn_implementation).startswith(PACKED_PREFIX)


def pack_micro_batch(micro: DataProto, device: torch.device) -> PackedRows:
    return PackedRows.from_padded(*(micro.batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")))


def packed_response_log_probs_and_entropy(
    model: nn.Module, micro: DataProto, device: torch.device, temperature: float, with_entropy: bool, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token) [b, R] and the entropy [b, R] (or None); 0 at padding."""
    rows = pack_micro_batch(micro, device)
    slots, index = rows.response_predictors(micro.batch["responses"].shape[1])
    labels = micro.batch["responses"].to(device)[slots]
    inputs = {**rows.model_inputs(), **packed_vision_inputs(vision_forward_inputs(model, micro, device), rows.valid)}
    # logits_to_keep as indices: the LM head runs only where a response token is predicted.
    log_probs, entropy = token_log_probs_and_entropy(model, inputs, index, labels[None], temperature, with_entropy, entropy_grad)
    log_probs = scatter_slots(log_probs[0], slots)
    return log_probs, None if entropy is None else scatter_slots(entropy[0], slots)


def packed_token_outputs(model: nn.Module, micro: DataProto, device: torch.device, **kwargs: Any) -> tuple[Any, PackedRows]:
    """Run the model on the packed micro-batch; returns its output and the packing (to map positions back)."""
    rows = pack_micro_batch(micro, device)
    return model(**rows.model_inputs(), **kwargs), rows


def packed_response_values(model: nn.Module, micro: DataProto, device: torch.device) -> torch.Tensor:
    """Value head output [b, R] for the state before each response token (0 where that state is padding)."""
    out, rows = packed_token_outputs(model, micro, device)
    length = micro.batch["responses"].shape[1]
    return rows.to_padded(out.logits[0, :, 0].float())[:, -length - 1 : -1]
