"""The settings of a strategy and of its inference engine, as dataclasses built from plain dicts.

    strategy = get_strategy({"backend": "fsdp2", "grad_clip": 1.0, "optimizer_offload": True})
    strategy.setup_inference_engine({"model_path": path, "group_size": 1}, engine_type="vllm")

Unknown keys and bad values raise a `ValueError` naming the key and what is valid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workers.config_fields import is_number
from workers.dtypes import DTYPE_NAMES
from workers.megatron.router_training import ROUTER_DTYPES
from workers.rl_math.names import DEFAULT_LOGITS_CHUNK_TOKENS

BACKENDS = ("fsdp2", "megatron")
ENGINE_TYPES = ("vllm", "hf")

Settings = TypeVar("Settings")


def _from_mapping(cls: type[Settings], values: Any, what: str) -> Settings:
    """`cls(**values)` for a dict (or `values` itself when it is already a `cls`), naming unknown keys."""
    if isinstance(values, cls):
        return values
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise TypeError(f"{what} must be a dict or a {cls.__name__}, got {type(values).__name__}")
    _check_keys(values, {f.name for f in dataclasses.fields(cls)}, what)
    return cls(**values)


def _check_keys(values: dict[str, Any], known: Any, what: str) -> None:
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown keys {unknown}; valid keys: {sorted(known)}")


# What `prepare` fills in when the optimizer or the LR schedule is given as a dict of settings.
OPTIMIZER_DEFAULTS = {"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
SCHEDULER_DEFAULTS = {
    "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant", "total_training_steps": None,
    "min_lr_ratio": 0.0, "num_cycles": 0.5,
}


def _with_defaults(values: dict[str, Any], defaults: dict[str, Any], what: str) -> dict[str, Any]:
    _check_keys(values, defaults, f"{what} settings")
    return {**defaults, **values}


def optimizer_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Adam(W) settings {"lr", "betas", "eps", "weight_decay"} with defaults filled in."""
    return _with_defaults(values, OPTIMIZER_DEFAULTS, "optimizer")


def scheduler_settings(values: dict[str, Any]) -> dict[str, Any]:
    """LR schedule settings (verl's optim key names, `SCHEDULER_DEFAULTS`) with defaults filled in."""
    return _with_defaults(values, SCHEDULER_DEFAULTS, "scheduler")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class MegatronSettings:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    expert_model_parallel_size: int = 1  # mixture of experts: each layer's experts split over this many ranks
    expert_tensor_parallel_size: int | None = None  # mixture of experts: each expert's TP size (None: the TP size)
    # A mixture of experts' router training, megatron-core's (and verl's override_transformer_config) names: the
    # load-balancing loss's per-layer coefficient, the z-loss's, and the gating's dtype (None: the compute dtype).
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float | None = None
    moe_router_dtype: str | None = None

    def __post_init__(self) -> None:
        _require(
            self.tensor_model_parallel_size >= 1,
            f"megatron.tensor_model_parallel_size must be >= 1, got {self.tensor_model_parallel_size}",
        )
        _require(
            self.expert_model_parallel_size >= 1,
            f"megatron.expert_model_parallel_size must be >= 1, got {self.expert_model_parallel_size}",
        )
        _require(
            self.expert_tensor_parallel_size is None or self.expert_tensor_parallel_size >= 1,
            f"megatron.expert_tensor_parallel_size must be None or >= 1, got {self.expert_tensor_parallel_size}",
        )
        _require(
            is_number(self.moe_aux_loss_coeff) and self.moe_aux_loss_coeff >= 0,
            f"megatron.moe_aux_loss_coeff must be a number >= 0, got {self.moe_aux_loss_coeff!r}",
        )
        _require(
            self.moe_z_loss_coeff is None or (is_number(self.moe_z_loss_coeff) and self.moe_z_loss_coeff > 0),
            f"megatron.moe_z_loss_coeff must be None (no z-loss) or a number > 0, got {self.moe_z_loss_coeff!r}",
        )
        _require(
            self.moe_router_dtype in (None, *ROUTER_DTYPES),
            f"megatron.moe_router_dtype {self.moe_router_dtype!r} is not valid; valid: None, "
            f"{', '.join(ROUTER_DTYPES)}",
        )
        # The strategy runs the user's forward and backward directly; pipeline stages need Megatron's schedules.
        _require(
            self.pipeline_model_parallel_size == 1,
            f"megatron.pipeline_model_parallel_size={self.pipeline_model_parallel_size}: the strategy supports 1 "
            "(a user loop calls forward and backward itself; pipeline stages need the Megatron workers' schedules)",
        )


@dataclass(frozen=True)
class StrategyConfig:
    backend: str = "fsdp2"
    seed: int = 0
    dtype: str = "auto"  # compute dtype: bfloat16 on GPU, float32 on CPU; master weights stay float32
    grad_clip: float = 1.0
    optimizer_offload: bool = False  # maybe_offload_optimizer / maybe_load_optimizer move the Adam state
    gradient_checkpointing: bool = False
    # sequence_log_probs (fsdp2): the LM head's log-softmax this many tokens at a time; 0: full logits.
    logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS
    # A mixture of experts: the routers' load-balancing loss averaged over the layers, the trainer's
    # actor.router_aux_loss_coef (both backends; megatron.moe_aux_loss_coeff is megatron-core's per-layer one).
    router_aux_loss_coef: float | None = None
    megatron: MegatronSettings = field(default_factory=MegatronSettings)

    def __post_init__(self) -> None:
        _require(
            self.backend in BACKENDS, f"strategy backend {self.backend!r} is not available; valid: {list(BACKENDS)}"
        )
        _require(self.dtype in DTYPE_NAMES, f"strategy dtype {self.dtype!r} is not valid; valid: {list(DTYPE_NAMES)}")
        _require(self.grad_clip > 0, f"strategy grad_clip must be > 0, got {self.grad_clip}")
        chunk = self.logits_chunk_tokens
        _require(
            isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 0,
            f"strategy logits_chunk_tokens must be an int >= 0 (0: full logits), got {chunk!r}",
        )
        coef = self.router_aux_loss_coef
        _require(
            coef is None or (is_number(coef) and coef >= 0),
            f"strategy router_aux_loss_coef must be None (off) or a number >= 0, got {coef!r}",
        )
        object.__setattr__(self, "megatron", _from_mapping(MegatronSettings, self.megatron, "strategy megatron"))
        megatron = self.megatron
        router_keys = [key for key in ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_dtype")
                       if getattr(megatron, key) != getattr(MegatronSettings, key)]
        _require(
            self.backend == "megatron" or not router_keys,
            f"strategy megatron.{', megatron.'.join(router_keys)} act on megatron-core's routers (backend megatron); "
            "with backend fsdp2 set router_aux_loss_coef (the load-balancing loss averaged over the layers)",
        )
        _require(
            coef is None or megatron.moe_aux_loss_coeff == 0,
            f"strategy router_aux_loss_coef={coef} and megatron.moe_aux_loss_coeff={megatron.moe_aux_loss_coeff} "
            "are two coefficients of one loss (averaged over the layers, or per layer); set one",
        )

    @classmethod
    def parse(cls, values: Any) -> "StrategyConfig":
        return _from_mapping(cls, values, "strategy config")


@dataclass(frozen=True)
class InferenceConfig:
    model_path: str = ""  # the HF folder the engine starts from; update_engine_weights brings the trained weights
    group_size: int = 1  # strategy ranks sharing one engine (on the group's first rank)
    dtype: str = "auto"  # the engine's dtype: "auto" is the strategy's compute dtype
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.3  # vllm on GPU: the engine shares the device with training
    cpu_kv_cache_mb: int = 256  # vllm on CPU
    # vllm on GPU: a fixed KV cache (GiB per GPU) instead of vLLM's start-up measurement of free memory, which
    # fails when other processes on the GPU allocate or free meanwhile (None: sized within gpu_memory_utilization)
    kv_cache_gib: float | None = None
    enforce_eager: bool | None = None  # None: CUDA graphs on a GPU, eager on CPU
    enable_sleep: bool = True  # GPU: maybe_sleep_inference_engine releases the engine's memory
    verify: bool = True  # update_engine_weights checks the engine's log-probs against the model's
    verify_tolerance: float | None = None  # default by dtype: 1e-3 (fp32), 0.25 (bf16)
    bucket_mb: int = 512

    def __post_init__(self) -> None:
        _require(bool(self.model_path), "inference config needs model_path (the HF folder the engine loads first)")
        _require(self.group_size >= 1, f"inference group_size must be >= 1, got {self.group_size}")
        _require(self.dtype in DTYPE_NAMES, f"inference dtype {self.dtype!r} is not valid; valid: {list(DTYPE_NAMES)}")
        _require(
            0 < self.gpu_memory_utilization <= 1,
            f"inference gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        kv = self.kv_cache_gib
        _require(
            kv is None or (is_number(kv) and kv > 0),
            "inference kv_cache_gib must be None (sized within gpu_memory_utilization) "
            f"or a number > 0 (GiB), got {kv!r}",
        )
        _require(self.bucket_mb >= 1, f"inference bucket_mb must be >= 1, got {self.bucket_mb}")

    @classmethod
    def parse(cls, values: Any) -> "InferenceConfig":
        return _from_mapping(cls, values, "inference config")

    def vllm_rollout_options(self) -> dict[str, Any]:
        """The rollout section `VLLMEngine` reads (one in-process engine, TP 1)."""
        return {
            "tensor_model_parallel_size": 1,
            "enable_sleep": self.enable_sleep,
            "free_cache_engine": self.enable_sleep,
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "cpu_kv_cache_mb": self.cpu_kv_cache_mb,
            "kv_cache_gib": self.kv_cache_gib,
        }
