"""Images on a worker: the encoded bytes a batch carries, decoded and run through the model's image processor.

The driver sends each row's images as encoded bytes (`non_tensor_batch["multi_modal_data"]`, per row
`{"image": [bytes, ...]}`: a few KiB each, the same object for a prompt's `rollout.n` copies). Each worker
decodes and processes the images of the rows it gets, once per step: the processed inputs are kept by the
digest of the encoded bytes, so the log-prob, reference and update passes of the step reuse the rollout's
(even after the driver re-balanced the rows over the workers, a row's image is processed at most once per
worker). Pixel tensors never travel between processes; `forget()` drops them at the end of the step.
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from protocol import DataProto

MULTI_MODAL_DATA = "multi_modal_data"  # driver -> workers: per row {"image": [encoded bytes, ...]}
MULTI_MODAL_INPUTS = "multi_modal_inputs"  # worker-local: per row {"pixel_values": [p, d], "image_grid_thw": [k, 3]}
IMAGE = "image"
DEFAULT_CACHE_BYTES = 2 << 30  # processed pixels kept per worker at most (the oldest go first)


def decode_image(data: bytes) -> Any:
    """Encoded bytes (PNG, JPEG, ...) -> an RGB PIL image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def row_images(data: DataProto) -> list[list[bytes]]:
    """Each row's encoded images ([] for a row without, or a batch without the key)."""
    column = data.non_tensor_batch.get(MULTI_MODAL_DATA)
    if column is None:
        return [[] for _ in range(len(data))]
    return [list((entry or {}).get(IMAGE) or []) for entry in column]


class ImageInputs:
    """The model's image processor on a worker, with the step's processed images kept by digest."""

    def __init__(self, model_path: str, budget_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(model_path)
        self.budget_bytes = budget_bytes
        self._processed: OrderedDict[bytes, dict[str, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self.processed_count = 0  # images run through the processor (the rest came from the cache)

    def _one(self, encoded: bytes) -> dict[str, torch.Tensor]:
        key = hashlib.blake2b(encoded, digest_size=16).digest()
        hit = self._processed.get(key)
        if hit is not None:
            self._processed.move_to_end(key)
            return hit
        out = self.processor(images=[decode_image(encoded)], return_tensors="pt")
        inputs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        self.processed_count += 1
        self._processed[key] = inputs
        self._bytes += inputs["pixel_values"].nbytes
        while self._bytes > self.budget_bytes and len(self._processed) > 1:
            _, dropped = self._processed.popitem(last=False)
            self._bytes -= dropped["pixel_values"].nbytes
        return inputs

    def row_inputs(self, images: list[bytes]) -> dict[str, torch.Tensor]:
        """One row's processor outputs: pixel_values [patches, features] and image_grid_thw [images, 3]."""
        parts = [self._one(encoded) for encoded in images]
        if not parts:
            return {"pixel_values": torch.empty(0), "image_grid_thw": torch.empty(0, 3, dtype=torch.long)}
        return {key: torch.cat([p[key] for p in parts]) for key in ("pixel_values", "image_grid_thw")}

    def attach(self, data: DataProto) -> DataProto:
        """`data` plus `non_tensor_batch[MULTI_MODAL_INPUTS]` (this process only: never returned to the driver);
        `data` itself when it carries no images."""
        if MULTI_MODAL_DATA not in data.non_tensor_batch:
            return data
        rows = np.empty(len(data), dtype=object)
        rows[:] = [self.row_inputs(images) for images in row_images(data)]
        return data.union(DataProto.from_dict(non_tensors={MULTI_MODAL_INPUTS: rows}))

    def forget(self) -> None:
        """Drop the processed images (the step is over: the next one brings other rows)."""
        self._processed.clear()
        self._bytes = 0
