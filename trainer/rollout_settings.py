"""Checks of the rollout settings the driver loop acts on (kept free of torch: the config loader imports it)."""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.validation_settings import check_validation_settings
from workers.rollout_choices import ASYNC_TRAINING_DEFAULTS


def check_rollout_settings(cfg: DictConfig) -> list[str]:
    """Problems of the rollout settings across keys (the values themselves: the workers' schema, checked first)."""
    rollout = cfg.actor_rollout_ref.rollout
    problems = _separate_engines_problem(rollout, "staleness=1", "to generate") if rollout.staleness == 1 else []
    problems += check_async_settings(cfg) + check_gpu_shares(cfg) + check_validation_settings(cfg)
    problems += check_hybrid_group(cfg)
    if rollout.tis_imp_ratio_cap is not None and rollout.name != "vllm":
        problems.append(
            "actor_rollout_ref.rollout.tis_imp_ratio_cap needs the engine's log-probs of the sampled tokens, which "
            f"rollout.name=vllm returns (got {rollout.name!r})"
        )
    return problems


def _separate_engines_problem(rollout: DictConfig, setting: str, doing: str) -> list[str]:
    if rollout.name == "vllm" and rollout.placement == "separate":
        return []
    return [
        f"actor_rollout_ref.rollout.{setting} needs engines of their own {doing} while the actor trains: set "
        f"rollout.name=vllm and rollout.placement=separate (got name={rollout.name!r}, placement={rollout.placement!r})"
    ]


def check_hybrid_group(cfg: DictConfig) -> list[str]:
    """A hybrid engine of tensor-parallel k is shared by k consecutive trainer ranks (workers/rollout/engine_group.py):
    k must divide the trainer's ranks."""
    rollout, trainer = cfg.actor_rollout_ref.rollout, cfg.trainer
    tp = rollout.tensor_model_parallel_size
    ranks = trainer.n_gpus_per_node * trainer.nnodes if isinstance(trainer.n_gpus_per_node, int) else None
    if rollout.name != "vllm" or rollout.placement != "hybrid" or not isinstance(tp, int) or tp <= 1 or ranks is None:
        return []
    if ranks % tp:
        return [
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the trainer's {ranks} workers "
            f"(trainer.n_gpus_per_node x trainer.nnodes): each hybrid engine is shared by {tp} of them"
        ]
    return []


def check_async_settings(cfg: DictConfig) -> list[str]:
    """Problems across the fully asynchronous training keys (async_training, max_staleness, stale_groups,
    partial_rollout) and the rest of the config."""
    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.async_training:
        return _async_only_keys_set(rollout)
    problems = _separate_engines_problem(rollout, "async_training=true", "generating")
    if rollout.staleness != 0:
        problems.append(
            f"actor_rollout_ref.rollout.staleness={rollout.staleness!r} is the one-step-off setting of synchronous "
            "training; with async_training=true bound the staleness with rollout.max_staleness (and leave staleness "
            "at 0)"
        )
    if cfg.algorithm.adv_estimator == "remax":
        problems.append(
            "algorithm=remax generates a greedy baseline of each step's prompts on demand, which async_training does "
            "not schedule; use rollout.async_training=false (optionally rollout.staleness=1) or another algorithm "
            "(grpo, rloo, ppo)"
        )
    return problems


def _async_only_keys_set(rollout: DictConfig) -> list[str]:
    """A key of fully asynchronous training set while it is off: most likely the old spelling of it,
    rollout.mode=async (now verl's key). One line naming the key to set."""
    changed = [f"{key}={rollout.get(key, default)!r}" for key, default in ASYNC_TRAINING_DEFAULTS.items()
               if rollout.get(key, default) != default]
    if not changed:
        return []
    one = len(changed) == 1
    problem = (
        f"actor_rollout_ref.rollout.{', '.join(changed)}: {'acts' if one else 'act'} only in fully asynchronous "
        "training, which is actor_rollout_ref.rollout.async_training=true (rollout.mode=async is verl's key and no "
        f"longer turns it on); set that, or leave {'it' if one else 'them'} at the default"
    )
    return [problem]


def check_gpu_shares(cfg: DictConfig) -> list[str]:
    """trainer.gpus_per_process and rollout.gpus_per_engine: fractions of a GPU, so pools can share one."""
    problems = []
    share = cfg.trainer.get("gpus_per_process", 1)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        problems.append(
            f"trainer.gpus_per_process={share!r} must be a number in (0, 1] (GPUs each trainer process reserves)"
        )
    rollout = cfg.actor_rollout_ref.rollout
    engine = rollout.get("gpus_per_engine")
    if engine is not None and (rollout.tensor_model_parallel_size != 1 or rollout.placement != "separate"):
        problems.append(
            "actor_rollout_ref.rollout.gpus_per_engine sets the GPU share of a separate engine of "
            "tensor_model_parallel_size 1 (leave it null otherwise)"
        )
    return problems
