"""The shape of a decoder-only model, read from its `config.json`, and its parameter counts.

Counts follow the Hugging Face layout of Llama-style decoders (Qwen2/Qwen3/Llama/Mistral): embedding,
per layer q/k/v/o projections, a gated MLP (gate/up/down) and two RMSNorms, a final norm and an LM head
(absent when the embeddings are tied). Qwen2 has biases on q/k/v; Llama-style configs say so with
`attention_bias` / `mlp_bias`; Qwen3 adds a per-head RMSNorm on queries and keys. Mixture-of-experts models
(Qwen2-MoE, Qwen3-MoE) replace the MLP of their sparse layers by a router and experts (`moe.py`). Other model
types are counted the same way and the plan says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trainer.memory_plan.moe import (
    EXACT_MOE_TYPES,
    MoeShape,
    engine_sparse_lora_params,
    moe_from_config,
    sparse_lora_params,
)
from workers.lora.moe_vllm import EXPERT_TARGETS
from workers.lora.spec import smallest_rank_slot

# Model types whose parameters these formulas count exactly (checked against transformers in the tests).
EXACT_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral", *EXACT_MOE_TYPES)
# The linear layers of one decoder layer: name -> (input features, output features) as a function of the shape.
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_NAMES = LINEAR_NAMES[:4]
# nn.Linear layers only some models have: Qwen2-MoE's shared-expert gate (PEFT's "all-linear" adapts it).
SHARED_GATE = "shared_expert_gate"
ROUTER = "gate"  # Qwen3-MoE's router, which PEFT adapts under its transformers-4 name
ADAPTABLE_NAMES = (*LINEAR_NAMES, ROUTER, SHARED_GATE)


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
    moe: MoeShape | None = None  # the experts of a mixture-of-experts model (None: dense)

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
        layers = int(config["num_hidden_layers"])
        # Qwen2-MoE names its q/k/v bias `qkv_bias` (default on); Qwen2 always has one.
        qkv_bias = model_type == "qwen2" or (model_type == "qwen2_moe" and config.get("qkv_bias", True) is not False)
        return cls(
            model_type=model_type,
            vocab=int(config["vocab_size"]),
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            # transformers' default for a config without the key is untied.
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias") or False),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            moe=moe_from_config(config, layers),
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

    def sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` has experts instead of a dense MLP."""
        return self.moe is not None and self.moe.sparse(layer)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one dense decoder layer."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    def layer_linears(self, layer: int) -> dict[str, tuple[int, int]]:
        """(in, out) of the nn.Linear layers of decoder layer `layer` (what LoRA can adapt): a sparse layer's
        are attention's and its shared expert's (the router and the experts are plain parameters)."""
        linears = self.linear_shapes()
        if not self.sparse(layer):
            return linears
        return {**{n: linears[n] for n in ATTENTION_NAMES}, **self.moe.shared_linears(self.hidden)}

    def linear_names(self) -> tuple[str, ...]:
        """The names PEFT's "all-linear" adapts in the decoder layers, in ADAPTABLE_NAMES order: the nn.Linear
        layers, and with Qwen3-MoE the experts' and the router's transformers-4 names (`MoeShape.peft_experts`)."""
        if self.moe is not None and self.moe.peft_experts:
            return (*LINEAR_NAMES, ROUTER)
        names = {n for layer in range(self.layers) for n in self.layer_linears(layer)}
        return tuple(n for n in ADAPTABLE_NAMES if n in names)

    def attention_params(self) -> int:
        """One layer's attention with its two RMSNorms (and Qwen3's q/k norms)."""
        linears = self.linear_shapes()
        weights = sum(linears[n][0] * linears[n][1] for n in ATTENTION_NAMES)
        biases = (self.q_width + 2 * self.kv_width) * self.qkv_bias + self.hidden * self.o_bias
        norms = 2 * self.hidden + 2 * self.head_dim * self.qk_norm
        return weights + biases + norms

    def mlp_params(self, layer: int) -> int:
        """Layer `layer`'s MLP: the dense gated MLP, or the router, experts and shared expert."""
        if self.sparse(layer):
            return self.moe.block_params(self.hidden)
        h, i = self.hidden, self.intermediate
        return 3 * h * i + (2 * i + h) * self.mlp_bias

    def layer_params(self, layer: int | None = None) -> int:
        """Parameters of decoder layer `layer`; None: the largest layer (an FSDP unit's size, an upper bound)."""
        if layer is not None:
            return self.attention_params() + self.mlp_params(layer)
        return max(self.layer_params(i) for i in self._layer_kinds())

    def _layer_kinds(self) -> tuple[int, ...]:
        """One layer index of each kind present (dense, sparse): enough for per-kind maxima."""
        if self.moe is None:
            return (0,)
        sparse = next((i for i in range(self.layers) if self.sparse(i)), None)
        dense = self.moe.dense_layers[0] if self.moe.dense_layers else None
        return tuple(i for i in (dense, sparse) if i is not None) or (0,)

    def decoder_params(self) -> int:
        """Parameters of all decoder layers."""
        if self.moe is None:
            return self.layers * self.layer_params(0)
        return sum(self.layer_params(i) for i in range(self.layers))

    def active_multiply_adds(self) -> int:
        """Weight multiply-adds of one token through every decoder layer: a sparse layer counts its router, the
        top-k experts it routes to and its shared expert, not every expert (MFU by active parameters)."""
        dense = sum(a * b for a, b in self.linear_shapes().values())
        if self.moe is None:
            return self.layers * dense
        attention = sum(a * b for n, (a, b) in self.linear_shapes().items() if n in ATTENTION_NAMES)
        sparse_layers = sum(1 for i in range(self.layers) if self.sparse(i))
        dense_layers = self.layers - sparse_layers
        return dense_layers * dense + sparse_layers * (attention + self.moe.active_multiply_adds(self.hidden))

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
        return self.decoder_params() + self.root_params(head)

    def largest_tensor(self) -> int:
        """Elements of the largest single parameter (the embedding for a dense model's real vocabulary; an MoE
        model's experts' gate_up_proj may be larger: it holds every expert)."""
        experts = self.moe.largest_tensor(self.hidden) if self.moe is not None else 0
        return max(self.embedding_params(), experts, *(a * b for a, b in self.linear_shapes().values()))


def lora_targets(
    target_modules: Any, exclude_modules: Any = None, linear_names: tuple[str, ...] = LINEAR_NAMES
) -> tuple[str, ...]:
    """The decoder-layer linears that get an adapter: "all-linear" is every one of `linear_names` (the model's
    nn.Linear layers, `ModelShape.linear_names`; not the LM head, as in PEFT); a list names them;
    `exclude_modules` removes names."""
    if target_modules in (None, "all-linear"):
        names = list(linear_names)
    else:
        names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        names = [n for n in ADAPTABLE_NAMES if n in names]
    excluded = (
        []
        if exclude_modules is None
        else ([exclude_modules] if isinstance(exclude_modules, str) else list(exclude_modules))
    )
    return tuple(n for n in names if n not in excluded)


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: rank x (in + out) per adapted linear of each layer (a name a layer lacks: none)."""
    if shape.moe is None:
        linears = shape.linear_shapes()
        return shape.layers * sum(rank * (linears[n][0] + linears[n][1]) for n in targets if n in linears)
    return sum(layer_lora_params(shape, layer, rank, targets) for layer in range(shape.layers))


def layer_lora_params(shape: ModelShape, layer: int, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters of decoder layer `layer` of an MoE model: attention's, and the sparse block's
    (`moe.sparse_lora_params`) or the dense MLP's (none where PEFT maps the MLP names onto the experts)."""
    linears = shape.linear_shapes()
    attention = sum(rank * (linears[n][0] + linears[n][1]) for n in targets if n in ATTENTION_NAMES)
    if shape.sparse(layer):
        return attention + sparse_lora_params(shape.moe, shape.hidden, rank, targets)
    if shape.moe.peft_experts:
        return attention
    mlp = [n for n in targets if n in linears and n not in ATTENTION_NAMES]
    return attention + sum(rank * (linears[n][0] + linears[n][1]) for n in mlp)


def vllm_lora_rank(rank: int) -> int:
    """The adapter slot rank vLLM allocates for `rank` (its `max_lora_rank`); the rank itself above vLLM's largest
    slot, which preflight refuses (the plan still counts it)."""
    return smallest_rank_slot(rank) or rank


def engine_lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """A vLLM engine's adapter buffers for LoRA rank `rank`: every adapted module at the engine's one slot rank,
    which must hold 2r when a mixture of experts' fused experts are adapted (their gate_up factors have rank 2r;
    workers/lora/moe_vllm.py), with per-expert slices for the experts."""
    fused = shape.moe is not None and shape.moe.peft_experts and bool(set(targets) & EXPERT_TARGETS)
    if not fused:
        return lora_params(shape, vllm_lora_rank(rank), targets)
    slot = vllm_lora_rank(2 * rank)
    linears = shape.linear_shapes()
    attention = sum(slot * (linears[n][0] + linears[n][1]) for n in targets if n in ATTENTION_NAMES)
    sparse = engine_sparse_lora_params(shape.moe, shape.hidden, slot, targets)
    return sum(attention + (sparse if shape.sparse(layer) else 0) for layer in range(shape.layers))


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
