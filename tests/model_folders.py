"""Tiny random-init Qwen2 folders for tests (nothing downloaded): the same weights for the same config and seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def write_random_qwen2(path: Path, config: dict[str, Any], seed: int = 0) -> str:
    """Save a Qwen2ForCausalLM of `config` (Qwen2Config keywords), initialised from `seed`, into `path`."""
    torch.manual_seed(seed)
    Qwen2ForCausalLM(Qwen2Config(**config)).save_pretrained(path)
    return str(path)
