"""The extra forward inputs of a vision-language micro-batch: pixels, image grids and 3-D rope positions.

A Qwen2-VL forward needs `pixel_values` and `image_grid_thw` (from the worker's image processor,
workers/vision/images.py) and multimodal rope positions [3, b, S]: text tokens count up as usual, an image's
tokens take (time, row, column) positions, and the text after it resumes past the image's extent. The batch
keeps its 1-D `position_ids`; the rope positions are computed here from the tokens, the attention mask and
the grids, by the model's own `get_rope_index`, for the padded layout. A packed micro-batch takes the same
positions at its real tokens ([3, 1, T]), so each packed sequence has the rope index it has padded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from protocol import DataProto
from workers.vision.images import MULTI_MODAL_INPUTS


def _rope_owner(model: nn.Module) -> Any:
    owner = getattr(model, "model", model)
    if not hasattr(owner, "get_rope_index"):
        raise TypeError(
            f"{type(model).__name__} has no get_rope_index: its image inputs are not supported (Qwen2-VL family)"
        )
    return owner


def image_token_types(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """mm_token_type_ids: 1 at image placeholder tokens, 0 elsewhere (int32, like the processor's)."""
    return (input_ids == model.config.image_token_id).int()


def rope_positions(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, grids: torch.Tensor
) -> torch.Tensor:
    """[3, b, S] multimodal rope positions of left-padded rows (0 at padding)."""
    positions, _ = _rope_owner(model).get_rope_index(
        input_ids,
        image_token_types(model, input_ids),
        image_grid_thw=grids if len(grids) else None,
        attention_mask=attention_mask,
    )
    return positions


def image_tensors(micro: DataProto, device: torch.device) -> dict[str, torch.Tensor] | None:
    """pixel_values and image_grid_thw of the micro-batch's images, in row order; None when it has none."""
    rows = micro.non_tensor_batch.get(MULTI_MODAL_INPUTS)
    if rows is None:
        return None
    filled = [row for row in rows if len(row["image_grid_thw"])]
    if not filled:
        return None
    return {key: torch.cat([row[key] for row in filled]).to(device) for key in ("pixel_values", "image_grid_thw")}


def vision_forward_inputs(model: nn.Module, micro: DataProto, device: torch.device) -> dict[str, torch.Tensor] | None:
    """The keyword arguments a padded forward of `micro` adds (replacing `position_ids`), or None for a
    micro-batch without images (its 1-D positions are what the model's rope uses for text)."""
    images = image_tensors(micro, device)
    if images is None:
        return None
    input_ids = micro.batch["input_ids"].to(device)
    attention_mask = micro.batch["attention_mask"].to(device)
    return {**images, "position_ids": rope_positions(model, input_ids, attention_mask, images["image_grid_thw"])}


def packed_vision_inputs(vision: dict[str, torch.Tensor] | None, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """`vision_forward_inputs` for the packed row: the rope positions of the real tokens ([3, 1, T])."""
    if vision is None:
        return {}
    positions = vision["position_ids"][:, valid]
    return {**vision, "position_ids": positions.unsqueeze(1)}


def generate_inputs(model: nn.Module, prompts: DataProto, device: torch.device) -> dict[str, torch.Tensor]:
    """The image keyword arguments of HF `generate` for left-padded prompts ({} without images); generate
    computes the rope positions itself from mm_token_type_ids and the grids."""
    images = image_tensors(prompts, device)
    if images is None:
        return {}
    return {**images, "mm_token_type_ids": image_token_types(model, prompts.batch["input_ids"].to(device))}
