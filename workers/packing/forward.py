"""Forward passes of HF models on packed micro-batches, with outputs in the padded layout.

Same results as the padded functions of `workers/fsdp/sequences.py` (log-probs, entropies, values,
per-token head outputs) at every real position, computed without running the model on padding; padding
positions of the outputs hold 0. The model must use the packed attention (`enable_packing`). With a
sequence-parallel group (`enable_sequence_parallel`, Ulysses) each rank of the group runs its shard of the
packed row and the per-token outputs are gathered back, so every rank returns the whole micro-batch's.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from protocol import DataProto
from workers.head_log_probs import token_log_probs_and_entropy
from workers.packing.attention import PACKED_PREFIX, packed_implementation
from workers.packing.layout import PackedRows, scatter_slots
from workers.packing.ulysses import SequenceParallel, check_heads, gather_shards, shard_packed_row
from workers.vision.forward_inputs import packed_vision_inputs, vision_forward_inputs
from workers.vision.models import attention_setting

_sequence_parallel: "weakref.WeakKeyDictionary[nn.Module, SequenceParallel]" = weakref.WeakKeyDictionary()


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


def enable_sequence_parallel(model: nn.Module, sequence_parallel: SequenceParallel, setting: str) -> None:
    """Packed forwards of `model` run split over the group (`setting` names the config key, for errors)."""
    if not is_packed(model):
        raise ValueError(
            f"{setting}={sequence_parallel.size} splits packed sequences, but {type(model).__name__} runs padded "
            "forwards (model.use_remove_padding=false, or a model that cannot run packed); set use_remove_padding "
            "to null or true, or the sequence-parallel size to 1"
        )
    config = model.config
    heads = config.num_attention_heads
    check_heads(heads, getattr(config, "num_key_value_heads", None) or heads, sequence_parallel.size, setting)
    _sequence_parallel[model] = sequence_parallel


def sequence_parallel_of(model: nn.Module) -> SequenceParallel | None:
    return _sequence_parallel.get(model)


def pack_micro_batch(micro: DataProto, device: torch.device) -> PackedRows:
    return PackedRows.from_padded(*(micro.batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")))


def packed_response_log_probs_and_entropy(
    model: nn.Module,
    micro: DataProto,
    device: torch.device,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token) [b, R] and the entropy [b, R] (or None); 0 at padding."""
    rows = pack_micro_batch(micro, device)
    slots, index = rows.response_predictors(micro.batch["responses"].shape[1])
    labels = micro.batch["responses"].to(device)[slots]
    sequence_parallel = sequence_parallel_of(model)
    vision = vision_forward_inputs(model, micro, device)
    if sequence_parallel is None:
        inputs = {**rows.model_inputs(), **packed_vision_inputs(vision, rows.valid)}
        # logits_to_keep as indices: the LM head runs only where a response token is predicted.
        log_probs, entropy = token_log_probs_and_entropy(
            model, inputs, index, labels[None], temperature, with_entropy, entropy_grad
        )
        log_probs, entropy = log_probs[0], None if entropy is None else entropy[0]
    else:
        if vision:
            raise ValueError(
                "ulysses_sequence_parallel_size > 1 with image inputs is not supported: the vision tower's "
                "embeddings are not split over the sequence-parallel ranks; set it to 1 for vision-language models"
            )
        shard = shard_packed_row(rows, sequence_parallel)
        counts = shard.counts(index)
        mine, local_index = shard.local(index)
        # The LM head runs on this rank's predicting positions only; the other ranks score the rest.
        log_probs, entropy = token_log_probs_and_entropy(
            model, shard.inputs, local_index, labels[mine][None], temperature, with_entropy, entropy_grad
        )
        log_probs = gather_shards(log_probs[0], sequence_parallel, counts)
        entropy = None if entropy is None else gather_shards(entropy[0], sequence_parallel, counts)
    return scatter_slots(log_probs, slots), None if entropy is None else scatter_slots(entropy, slots)


def packed_token_outputs(
    model: nn.Module, micro: DataProto, device: torch.device, **kwargs: Any
) -> tuple[Any, PackedRows]:
    """Run the model on the packed micro-batch; returns its output and the packing (to map positions back)."""
    rows = pack_micro_batch(micro, device)
    return model(**rows.model_inputs(), **kwargs), rows


def packed_response_values(model: nn.Module, micro: DataProto, device: torch.device) -> torch.Tensor:
    """Value head output [b, R] for the state before each response token (0 where that state is padding)."""
    length = micro.batch["responses"].shape[1]
    rows = pack_micro_batch(micro, device)
    sequence_parallel = sequence_parallel_of(model)
    if sequence_parallel is None:
        values = model(**rows.model_inputs()).logits[0, :, 0].float()
    else:
        shard = shard_packed_row(rows, sequence_parallel)
        local = model(**shard.inputs).logits[0, :, 0].float()
        values = gather_shards(local, sequence_parallel, [shard.width] * shard.size)[: rows.num_tokens]
    return rows.to_padded(values)[:, -length - 1 : -1]
