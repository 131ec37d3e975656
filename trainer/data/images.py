"""Image prompts on the driver, in verl's data format: a chat prompt whose text holds one `<image>` per
picture, and an image column (`data.image_key`, verl's `images`) holding each row's pictures as encoded bytes:
a list of `{"bytes": ..., "path": ...}` structs (Hugging Face datasets' image feature, as verl's geo3k parquet
has it), of plain binary values, or of `{"path": ...}` only (the file is read).

The driver never decodes a picture here: it reads each image's size from its header, asks the model's image
processor how many patches that size becomes, and writes the prompt with the model's vision tokens
(`<|vision_start|>`, one `<|image_pad|>` per merged patch, `<|vision_end|>`) in place of each `<image>`, so
prompt lengths, padding and truncation are final on the driver. The encoded bytes travel with the batch
(`multi_modal_data`); the workers decode and process them (workers/vision/images.py).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMAGE_PLACEHOLDER = "<image>"


def image_bytes(cell: Any) -> bytes:
    """The encoded bytes of one entry of an image column (bytes, {"bytes": ...} or {"path": ...})."""
    if isinstance(cell, (bytes, bytearray)):
        return bytes(cell)
    if isinstance(cell, Mapping):
        if cell.get("bytes"):
            return bytes(cell["bytes"])
        if cell.get("path"):
            return Path(cell["path"]).read_bytes()
    raise TypeError(f"an image is encoded bytes or a {{'bytes': ..., 'path': ...}} dict, got {type(cell).__name__}")


def row_image_bytes(cells: Any) -> list[bytes]:
    """All encoded images of one row's image cell (None or [] for none)."""
    return [image_bytes(cell) for cell in (cells or [])]


def placeholder_count(messages: Any) -> int:
    """How many `<image>` placeholders the text of a row's messages holds."""
    return sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in messages or [] if isinstance(m, Mapping))


def header_size(encoded: bytes) -> tuple[int, int]:
    """(height, width) from the image's header, without decoding its pixels."""
    from PIL import Image

    with Image.open(io.BytesIO(encoded)) as image:
        width, height = image.size
    return height, width


@dataclass(frozen=True)
class VisionTokens:
    """How the model writes one image in a prompt: start token, placeholder token x (tokens of the image), end."""

    start: str
    placeholder: str
    end: str
    placeholder_id: int
    processor: Any  # the model's image processor: only its resize rule is used here
    merge: int  # patches merged into one token per side

    @classmethod
    def from_model(cls, path: str, tokenizer: Any) -> "VisionTokens":
        from transformers import AutoConfig, AutoImageProcessor

        config = AutoConfig.from_pretrained(path)
        processor = AutoImageProcessor.from_pretrained(path)
        ids = [int(config.vision_start_token_id), int(config.image_token_id), int(config.vision_end_token_id)]
        names = tokenizer.convert_ids_to_tokens(ids)
        return cls(*names, ids[1], processor, int(getattr(processor, "merge_size", 1)))

    def tokens_of(self, encoded: bytes) -> int:
        """Placeholder tokens of one image: the processor's patches of its resized size, merged."""
        height, width = header_size(encoded)
        return self.processor.get_number_of_image_patches(height, width, {}) // self.merge**2

    def expand(self, messages: list[dict[str, Any]], counts: list[int]) -> list[dict[str, Any]]:
        """Copies of `messages` with the i-th `<image>` written as vision tokens holding `counts[i]` placeholders."""
        remaining = iter(counts)
        expanded = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str) and IMAGE_PLACEHOLDER in content:
                pieces = content.split(IMAGE_PLACEHOLDER)
                content = pieces[0] + "".join(
                    f"{self.start}{self.placeholder * next(remaining)}{self.end}{piece}" for piece in pieces[1:]
                )
            expanded.append({**message, "content": content})
        return expanded
