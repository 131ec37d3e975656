"""What a model's config says about its experts, read without torch (the config checks run before it loads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def model_has_experts(config: Any) -> bool:
    """Whether a transformers config, or a config.json's dict (a vision-language model's text part included), is a
    mixture of experts."""
    field = (lambda c, name: c.get(name)) if isinstance(config, Mapping) else (lambda c, name: getattr(c, name, None))
    text = field(config, "text_config") or config
    return int(field(text, "num_experts") or field(text, "num_local_experts") or 0) > 0
