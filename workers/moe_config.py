"""What a model's config says about its experts, read without torch (the config checks run before it loads)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def model_has_experts(config: Any) -> bool:
    """Whether a transformers config, or a config.json's dict (a vision-language model's text part included), is a
    mixture of experts."""
    field = (lambda c, name: c.get(name)) if isinstance(config, Mapping) else (lambda c, name: getattr(c, name, None))
    text = field(config, "text_config") or config
    return int(field(text, "num_experts") or field(text, "num_local_experts") or 0) > 0


def folder_has_experts(model_path: str) -> bool:
    """Whether the model folder's config.json is a mixture of experts (False where the folder has none yet: the
    workers decide from the loaded model's config)."""
    config_file = Path(model_path) / "config.json"
    return config_file.is_file() and model_has_experts(json.loads(config_file.read_text()))
