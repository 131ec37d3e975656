"""The batch keys a worker method needs, and the response mask every loss reads."""

from __future__ import annotations

import torch

from protocol import DataProto


def require_batch_keys(data: DataProto, keys: tuple[str, ...] | list[str], method: str) -> None:
    present = set(data.batch.keys())
    missing = [k for k in keys if k not in present]
    if missing:
        raise KeyError(f"{method} needs batch keys {list(keys)}; missing {missing} (batch has {sorted(present)})")


def response_mask(data: DataProto) -> torch.Tensor:
    """`response_mask` if the batch has one, else the response part of `attention_mask`."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -length:]
