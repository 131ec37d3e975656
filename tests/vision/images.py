"""Builders shared by the image tests: pictures, and rollout-shaped batches carrying them."""

from __future__ import annotations

import io

import numpy as np
import torch
from transformers import AutoTokenizer

from protocol import DataProto
from trainer.data.images import VisionTokens
from workers.vision.images import MULTI_MODAL_DATA

RED, BLUE = (220, 30, 30), (30, 30, 220)


def png(rgb: tuple[int, int, int], side: int = 56) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), rgb, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def prompt_ids(model_dir: str, texts: list[str], images: list[list[bytes]]) -> list[list[int]]:
    """Chat-templated prompts with each `<image>` written as the model's vision tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vision = VisionTokens.from_model(model_dir, tokenizer)
    rows = []
    for text, pictures in zip(texts, images):
        messages = vision.expand([{"role": "user", "content": text}], [vision.tokens_of(p) for p in pictures])
        rows.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    return rows


def image_batch(model_dir: str, texts: list[str], images: list[list[bytes]], responses: list[list[int]] | None = None,
                response_length: int = 6, pad: int = 0) -> DataProto:
    """Left-padded prompts (+ right-padded responses when given) with `multi_modal_data`, as the rollout returns them."""
    rows = prompt_ids(model_dir, texts, images)
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids):] = torch.tensor(ids)
        mask[i, width - len(ids):] = 1
    tensors = {"input_ids": input_ids, "attention_mask": mask}
    if responses is not None:
        response = torch.full((len(rows), response_length), pad, dtype=torch.long)
        response_mask = torch.zeros_like(response)
        for i, ids in enumerate(responses):
            response[i, : len(ids)] = torch.tensor(ids)
            response_mask[i, : len(ids)] = 1
        tensors = {"prompts": input_ids, "responses": response, "response_mask": response_mask,
                   "input_ids": torch.cat([input_ids, response], 1), "attention_mask": torch.cat([mask, response_mask], 1)}
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(1) - 1).clamp(min=0)
    data = np.empty(len(rows), dtype=object)
    data[:] = [{"image": list(pictures)} for pictures in images]
    return DataProto.from_dict(tensors, {MULTI_MODAL_DATA: data})
