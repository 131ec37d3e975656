"""What a LoRA run trains, from `actor_rollout_ref.model` (verl's keys): rank, alpha, target/excluded modules.

`LoraSpec` is plain, picklable data: the FSDP actor builds its PEFT adapters from it, the vLLM engines get
the same adapter description (PEFT's `adapter_config.json` fields), and an export writes it next to the
adapter's tensors. Parameter names: inside the trainer an adapter factor is
`model.layers.0.self_attn.q_proj.lora_A.default.weight` (transformers' PEFT integration, adapter "default");
PEFT's saved format (and what vLLM parses) is `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.moe_config import folder_has_experts

ADAPTER_NAME = "default"  # the one adapter a LoRA run trains
BASE_LAYER = ".base_layer"  # peft's adapted linear holds the original linear under this name
_FACTORS = (".lora_A.", ".lora_B.")
_PEFT_PREFIX = "base_model.model."
# vLLM allocates adapter slots of one of these ranks (`max_lora_rank`); an adapter may use any rank up to it.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]  # "all-linear" or module names
    exclude_modules: str | tuple[str, ...] | None

    @classmethod
    def from_model_config(cls, model_cfg: Mapping[str, Any]) -> "LoraSpec | None":
        """None when `lora_rank` is 0 or absent (full fine-tuning)."""
        rank = int(model_cfg.get("lora_rank", 0) or 0)
        if rank == 0:
            return None
        return cls(
            rank=rank,
            alpha=float(model_cfg.get("lora_alpha", 16)),
            target_modules=_names(model_cfg.get("target_modules", "all-linear")),
            exclude_modules=None if model_cfg.get("exclude_modules") is None else _names(model_cfg["exclude_modules"]),
        )

    @property
    def scaling(self) -> float:
        """What the adapter's product B·A is multiplied by (PEFT's plain LoRA: alpha / r)."""
        return self.alpha / self.rank

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=_peft_names(self.target_modules),
            exclude_modules=None if self.exclude_modules is None else _peft_names(self.exclude_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )

    def adapter_config(self) -> dict[str, Any]:
        """The fields of PEFT's `adapter_config.json` that vLLM reads (its `PEFTHelper`)."""
        return {
            "r": self.rank,
            "lora_alpha": self.alpha,
            "target_modules": _peft_names(self.target_modules),
            "bias": "none",
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
        }

    @property
    def vllm_max_lora_rank(self) -> int:
        return vllm_rank_slot(self.rank)


def smallest_rank_slot(rank: int) -> int | None:
    """The smallest of vLLM's adapter slots that holds factors of `rank`; None above the largest."""
    return next((size for size in VLLM_MAX_LORA_RANKS if size >= rank), None)


def vllm_rank_slot(rank: int) -> int:
    """The smallest of vLLM's adapter slots that holds factors of `rank`."""
    slot = smallest_rank_slot(rank)
    if slot is None:
        raise ValueError(f"an adapter rank of {rank} is above vLLM's largest adapter rank {VLLM_MAX_LORA_RANKS[-1]}")
    return slot


def _names(value: Any) -> str | tuple[str, ...]:
    return value if isinstance(value, str) else tuple(str(v) for v in value)


def _peft_names(value: str | tuple[str, ...]) -> str | list[str]:
    return value if isinstance(value, str) else list(value)


def is_adapter_parameter(name: str) -> bool:
    """Whether a trainer parameter name is a LoRA factor (A or B)."""
    return any(factor in name for factor in _FACTORS)


def peft_tensor_name(name: str) -> str:
    """A trainer parameter name of an adapter factor -> its name in PEFT's saved format (what vLLM parses)."""
    for factor in _FACTORS:
        marker = f"{factor}{ADAPTER_NAME}."
        if marker in name:
            return _PEFT_PREFIX + name.replace(marker, factor)
    raise ValueError(f"{name!r} is not a LoRA factor of adapter {ADAPTER_NAME!r}")


def base_sharing_problems(
    config: Mapping[str, Any], where: str = "", shard_ranks: int | None = None, experts: bool = False,
) -> list[str]:
    """Why the config cannot share the actor's frozen base with its vLLM engine (`rollout.share_base_weights`,
    workers/fsdp/shared_base.py); empty when it can, as far as the config tells (the dtypes "auto" resolve
    on the worker). `shard_ranks`: the ranks the actor's FSDP shards span, where known (fsdp_size=-1 means all
    the actor's ranks, which the section does not say); `experts`: the model is a mixture of experts (its
    config.json, which the section does not hold)."""
    key = f"{where}." if where else ""
    rollout, model = config["rollout"], config["model"]
    problems = []
    if model["lora_rank"] == 0:
        problems.append(f"{key}model.lora_rank=0 trains every weight (only a LoRA actor has a frozen base to share)")
    if config["actor"]["strategy"] != "fsdp":
        problems.append(f"{key}actor.strategy={config['actor']['strategy']!r} (sharing is built for the FSDP actor)")
    if rollout["name"] != "vllm":
        problems.append(f"{key}rollout.name={rollout['name']!r} (HF generate already runs on the actor's own weights)")
    elif rollout["placement"] != "hybrid":
        problems.append(
            f"{key}rollout.placement={rollout['placement']!r} "
            "(the engine must live in the actor's process: placement=hybrid)"
        )
    problems += tensor_parallel_sharing_problems(config, key, shard_ranks, experts)
    if "auto" not in (rollout["dtype"], model["dtype"]) and rollout["dtype"] != model["dtype"]:
        problems.append(
            f"{key}rollout.dtype={rollout['dtype']!r} differs from {key}model.dtype={model['dtype']!r} "
            "(one copy has one dtype)"
        )
    return problems


def tensor_parallel_sharing_problems(
    config: Mapping[str, Any], key: str = "", shard_ranks: int | None = None, experts: bool = False,
) -> list[str]:
    """A hybrid engine of tensor parallel k > 1 shares its base only as one shard per trainer rank whose FSDP shard
    group is the engine's k ranks: each rank's base shards are then its engine shard's weights. Not for a mixture of
    experts: the engine splits every expert's width over its ranks and FSDP splits the experts, so the experts
    (nearly all of the base) would stay the trainer's and sharing the rest would save little. One rule for the
    workers and the memory plan (trainer/memory_plan/setup.py)."""
    tp = config["rollout"]["tensor_model_parallel_size"]
    if tp == 1:
        return []
    problems = []
    if experts:
        problems.append(
            f"{key}rollout.tensor_model_parallel_size={tp} with a mixture of experts (the engine splits each "
            "expert's width over its ranks, FSDP splits the experts: their shards differ; tensor parallel 1 shares "
            "them)"
        )
    if config["rollout"]["engine_process"]:
        problems.append(
            f"{key}rollout.tensor_model_parallel_size={tp} with {key}rollout.engine_process=true (the engine's own "
            "processes hold its weights; with engine_process false each trainer rank holds one shard)"
        )
    fsdp_size = config["actor"]["fsdp_config"]["fsdp_size"]
    if shard_ranks is None and fsdp_size != -1:
        shard_ranks = fsdp_size  # -1 spans every actor rank, which only the worker knows
    if shard_ranks is not None and shard_ranks != tp:
        problems.append(
            f"{key}actor.fsdp_config.fsdp_size={fsdp_size}: the actor's FSDP shards span {shard_ranks} ranks and "
            f"{key}rollout.tensor_model_parallel_size={tp} the engine's (a rank's base shard must be its engine "
            f"shard: fsdp_size={tp}, or -1 on {tp} ranks)"
        )
    return problems


def check_lora_settings(config: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError for LoRA settings the actor/rollout config cannot run (`where` prefixes the keys, e.g.
    `actor_rollout_ref`): LoRA is built for the FSDP actor, and vLLM caps the adapter rank."""
    rank = config["model"]["lora_rank"]
    if rank == 0:
        return
    key = f"{where}." if where else ""
    if config["actor"]["strategy"] != "fsdp":
        raise ValueError(
            f"{key}model.lora_rank={rank} needs {key}actor.strategy=fsdp: the Megatron backend trains every weight "
            f"and has no LoRA; set {key}model.lora_rank=0 or {key}actor.strategy=fsdp"
        )
    if config["rollout"]["name"] == "vllm" and rank > VLLM_MAX_LORA_RANKS[-1]:
        raise ValueError(
            f"{key}model.lora_rank={rank} is above vLLM's largest adapter rank {VLLM_MAX_LORA_RANKS[-1]} "
            f"({key}rollout.name=vllm)"
        )


def check_base_sharing(config: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError when `rollout.share_base_weights=true` asks for what the config cannot do."""
    if config["rollout"]["share_base_weights"] is not True:
        return
    problems = base_sharing_problems(config, where, experts=folder_has_experts(config["model"]["path"]))
    if problems:
        key = f"{where}." if where else ""
        raise ValueError(
            f"{key}rollout.share_base_weights=true cannot share the actor's base weights with the rollout engine: "
            f"{'; '.join(problems)}. Set it to null (share where possible) or false"
        )

