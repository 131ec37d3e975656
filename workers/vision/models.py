"""What the workers need to know about a vision-language model (Qwen2-VL and its family): whether a folder
holds one, the class to load it with, its vision tokens and vision tower, and its settings that differ from a
text model's (LoRA leaves the vision tower alone, packed attention runs in the language model only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

# PEFT's exclude_modules default for a vision-language actor (a regex, as verl's docs give it): LoRA adapts the
# language model; the vision tower and its projector keep their weights.
VISION_TOWER_EXCLUDE = r".*(visual|vision_tower|vision_model|multi_modal_projector).*"
# The config fields naming a vision-language model's special tokens (Qwen2-VL's names).
VISION_TOKEN_FIELDS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")


def is_vision_language(config: Any) -> bool:
    """Whether a transformers config (or a config.json dict) is that of a vision-language model."""
    if isinstance(config, Mapping):
        return config.get("vision_config") is not None
    return getattr(config, "vision_config", None) is not None


def folder_is_vision_language(path: str) -> bool:
    from transformers import AutoConfig

    return is_vision_language(AutoConfig.from_pretrained(path))


def auto_model_class(model: str | Any) -> Any:
    """The transformers auto class a policy folder (or its loaded config) loads with: image-text-to-text for a
    vision-language model (Qwen2-VL is not registered as a causal LM), causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = folder_is_vision_language(model) if isinstance(model, str) else is_vision_language(model)
    return AutoModelForImageTextToText if vision else AutoModelForCausalLM


def vision_token_ids(config: Any) -> tuple[int, ...]:
    """The ids of the model's vision placeholder tokens (empty for a text model). A response must never hold
    one: the next forward would read it as a slot for image features."""
    if not is_vision_language(config):
        return ()
    return tuple(int(getattr(config, f)) for f in VISION_TOKEN_FIELDS if getattr(config, f, None) is not None)


def probe_vocab_size(config: Any) -> int:
    """How many token ids a text-only probe (workers/rollout/verify.py) may draw: the language model's
    vocabulary, cut below the first vision token of a vision-language model."""
    vocab = int(config.get_text_config().vocab_size)
    vision = vision_token_ids(config)
    return min(vocab, *vision) if vision else vocab


def language_model(model: nn.Module) -> nn.Module | None:
    """The decoder stack of a vision-language model (`model.model.language_model` in transformers 5)."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", None)


def vision_tower(model: nn.Module) -> nn.Module | None:
    inner = getattr(model, "model", None)
    for name in ("visual", "vision_tower"):
        tower = getattr(inner, name, None)
        if isinstance(tower, nn.Module):
            return tower
    return None


def vision_units(model: nn.Module) -> list[nn.Module]:
    """The vision tower's FSDP units, in the order they are sharded: each transformer block, then the tower
    itself (its patch embedding and merger). A unit of its own, the tower gathers its weights when it runs
    outside the model's forward too: HF `generate` encodes the images before the first forward. [] for a
    text model."""
    tower = vision_tower(model)
    if tower is None:
        return []
    blocks = getattr(tower, "blocks", None)
    return [*(blocks if isinstance(blocks, nn.ModuleList) else []), tower]


def with_vision_lora_default(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`model_cfg` with LoRA's exclude_modules set to the vision tower when it is a vision-language model's and
    the user left it unset (verl's recommended setting); otherwise unchanged."""
    cfg = dict(model_cfg)
    if (
        int(cfg.get("lora_rank") or 0) > 0
        and cfg.get("exclude_modules") is None
        and folder_is_vision_language(cfg["path"])
    ):
        cfg["exclude_modules"] = VISION_TOWER_EXCLUDE
    return cfg


def attention_setting(model: nn.Module, language: str) -> str | dict[str, str]:
    """`set_attn_implementation`'s argument putting `language` on the language model only: a vision tower keeps
    its own implementation (its attention is bidirectional over each image's patches, which the packed causal
    kernel is not)."""
    if not is_vision_language(model.config):
        return language
    vision = model.config.vision_config._attn_implementation or "sdpa"
    return {"": language, "text_config": language, "vision_config": vision}


def collapse_image_placeholders(token_ids: list[int], image_token_id: int) -> list[int]:
    """A prompt with each image's run of placeholder tokens cut to one: the form vLLM's multimodal processor
    expands itself (it would expand each token of an already expanded run again)."""
    return [t for i, t in enumerate(token_ids) if t != image_token_id or i == 0 or token_ids[i - 1] != image_token_id]
