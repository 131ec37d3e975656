"""Forward passes over prompt+response batches, aligned to the response tokens.

A row is `input_ids` = prompt (P, left-padded) + response (R, right-padded). The output at position t
predicts token t+1, so the R response tokens are scored by the outputs at positions P-1 .. P+R-2, i.e.
`out[:, -R-1:-1]`. Log-probs, entropies and values all use that alignment; a reward model's scores are read
at the response tokens themselves, `out[:, -R:]`.
"""

from __future__ import annotations

import torch
from torch import nn

from protocol import DataProto
from workers.head_log_probs import token_log_probs_and_entropy
from workers.packing.forward import (
    is_packed,
    packed_response_log_probs_and_entropy,
    packed_response_values,
    packed_token_outputs,
)
from workers.vision.forward_inputs import vision_forward_inputs

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")


def _sequence_inputs(micro: DataProto, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: micro.batch[k].to(device) for k in SEQUENCE_KEYS}


def response_log_probs_and_entropy(
    model: nn.Module,
    micro: DataProto,
    device: torch.device,
    temperature: float,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token) [b, R] (float32 for half-precision logits) and the entropy [b, R] or None
    (entropy_grad=False: no graph kept for it). A model with packed attention runs padding-free. The LM head
    scores a chunk of tokens at a time unless the model's logits_chunk_tokens is 0 (workers/head_log_probs.py)."""
    if is_packed(model):
        return packed_response_log_probs_and_entropy(model, micro, device, temperature, with_entropy, entropy_grad)
    responses = micro.batch["responses"].to(device)
    width, length = micro.batch["input_ids"].shape[1], responses.shape[1]
    # The outputs at positions P-1 .. P+R-2 predict the R response tokens; the head runs there only.
    predictors = torch.arange(width - length - 1, width - 1, device=device)
    # Rows with images add their pixels, image grids and multimodal rope positions (workers/vision).
    inputs = {
        **_sequence_inputs(micro, device),
        **(vision_forward_inputs(model, micro, device) or {}),
        "use_cache": False,
    }
    return token_log_probs_and_entropy(model, inputs, predictors, responses, temperature, with_entropy, entropy_grad)


def response_values(model: nn.Module, micro: DataProto, device: torch.device) -> torch.Tensor:
    """Value head output [b, R] for the state before each response token (a token-classification model)."""
    if is_packed(model):
        return packed_response_values(model, micro, device)
    length = micro.batch["responses"].shape[1]
    out = model(**_sequence_inputs(micro, device), use_cache=False)
    return out.logits[:, -length - 1 : -1, 0].float()


def response_scores(model: nn.Module, micro: DataProto, device: torch.device) -> torch.Tensor:
    """Score head output [b, R] at each response token (a sequence-classification model).

    HF pools at the rightmost token that differs from the pad id, which is wrong when a real token equals
    the pad id; reading the head's per-token output (a hook inside the FSDP root forward, where the
    parameters are gathered) lets the caller pick the position.
    """
    heads = [getattr(model, name, None) for name in ("score", "classifier")]
    head = next((h for h in heads if isinstance(h, nn.Module)), None)
    if head is None:
        raise ValueError(f"cannot find the score head (`score` or `classifier`) of {type(model).__name__}")
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        if is_packed(model):
            _, rows = packed_token_outputs(model, micro, device)
            scores = rows.to_padded(captured[0][0, :, 0].float())
        else:
            model(**_sequence_inputs(micro, device), use_cache=False)
            scores = captured[0][..., 0].float()
    finally:
        handle.remove()
    return scores[:, -micro.batch["responses"].shape[1] :]
