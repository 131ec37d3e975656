"""The shape of a decoder-only model, read from its `config.json`, and its parameter counts.

Counts follow the Hugging Face layout of Llama-style decoders (Qwen2/Qwen3/Llama/Mistral): embedding,
per layer q/k/v/o projections, a gated MLP (gate/up/down) and two RMSNorms, a final norm and an LM head
(absent when the embeddings are tied). Qwen2 has biases on q/k/v; Llama-style configs say so with
`attention_bias` / `mlp_bias`; Qwen3 adds a per-head RMSNorm on queries and keys. Other model types are
counted the same way and the plan says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# Model types whose parameters these formulas count exactly (checked against transformers in the tests).
EXACT_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# The linear layers of one decoder layer: name -> (input features, output features) as a function of the shape.
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def language_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields of a `config.json` dict: a vision-language model (Qwen2-VL) keeps its sizes
    and vocab_size in `text_config`, with tie_word_embeddings at the top; a text model's dict as it is."""
    text = config.get("text_config")
    if not (isinstance(text, Mapping) and "hidden_size" in text):
        return dict(config)
    return {**text, "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelShape":
        """From the dict of a `config.json` (a multimodal config's `text_config` when it has one)."""
        config = language_model_config(config)
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
            if k not in config
        ]
        if missing:
            raise ValueError(
                f"config.json has no {missing}; the memory plan needs a decoder-only language model's config"
            )
        model_type = str(config.get("model_type", "unknown"))
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        attention_bias = bool(config.get("attention_bias") or False)
        return cls(
            model_type=model_type,
            vocab=int(config["vocab_size"]),
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            # transformers' default for a config without the key is untied.
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias") or False),
            qk_norm=model_type == "qwen3",
        )

    @property
    def exact(self) -> bool:
        """Whether the parameter counts are those of a known model type (else a Llama-style approximation)."""
        return self.model_type in EXACT_MODEL_TYPES

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """Parameters of one decoder layer."""
        weights = sum(fan_in * fan_out for fan_in, fan_out in self.linear_shapes().values())
        biases = (self.q_width + 2 * self.kv_width) * self.qkv_bias + self.hidden * self.o_bias
        biases += (2 * self.intermediate + self.hidden) * self.mlp_bias
        norms = 2 * self.hidden + 2 * self.head_dim * self.qk_norm
        return weights + biases + norms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self, head: str = "lm") -> int:
        """The output head: "lm" (vocabulary; 0 when tied), "value" (one value per token, with bias: a
        critic), "score" (a reward model's score head, no bias)."""
        if head == "value":
            return self.hidden + 1
        if head == "score":
            return self.hidden
        return 0 if self.tied else self.vocab * self.hidden

    def root_params(self, head: str = "lm") -> int:
        """What FSDP's root unit holds (everything outside the decoder layers): embedding, final norm, head."""
        return self.embedding_params() + self.hidden + self.head_params(head)

    def total_params(self, head: str = "lm") -> int:
        return self.layers * self.layer_params() + self.root_params(head)

    def largest_tensor(self) -> int:
        """Elements of the largest single parameter (the embedding, for every real vocabulary)."""
        return max(self.embedding_params(), *(a * b for a, b in self.linear_shapes().values()))


def lora_targets(target_modules: Any, exclude_modules: Any = None) -> tuple[str, ...]:
    """The decoder-layer linears that get an adapter: "all-linear" is every one of them (not the LM head,
    as in PEFT); a list names them; `exclude_modules` removes names."""
    if target_modules in (None, "all-linear"):
        names = list(LINEAR_NAMES)
    else:
        names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        names = [n for n in LINEAR_NAMES if n in names]
    excluded = (
        []
        if exclude_modules is None
        else ([exclude_modules] if isinstance(exclude_modules, str) else list(exclude_modules))
    )
    return tuple(n for n in names if n not in excluded)


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: rank x (in + out) per adapted linear per layer."""
    linears = shape.linear_shapes()
    return shape.layers * sum(rank * (linears[n][0] + linears[n][1]) for n in targets)


def read_model_config(model_path: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The folder's `config.json` as a dict, with the run's `model.override_config` fields over it (verl's key:
    the trainer and the engine build the model so), in the language model's part of a multimodal config."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if overrides:
        text = config.get("text_config")
        target = text if isinstance(text, dict) and "hidden_size" in text else config
        target.update(dict(overrides))
    return config


def read_shape(model_path: str, key: str, overrides: Mapping[str, Any] | None = None) -> ModelShape:
    """The shape of the model folder's `config.json` (with `overrides`); ValueError naming `key` when it is not
    there."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{key}={model_path!r} has no config.json (the memory plan reads the model's shape from it)")
    try:
        return ModelShape.from_config(read_model_config(model_path, overrides))
    except (json.JSONDecodeError, ValueError, TypeError) as error:
        raise ValueError(f"{key}: {config_file}: {error}") from None
