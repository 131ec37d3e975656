"""verl's `fsdp_config.fsdp_size` (actor, reference, critic): the number of ranks each FSDP shard group spans. -1, or
at least the role's ranks, is plain FSDP over all of them: what this project does. A smaller size is hybrid
sharding (shards within groups, replicas across them), which is not provided. The key is the driver's: the
workers shard over all their ranks and never read it."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

SECTIONS = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config")


def fsdp_size_problems(cfg: DictConfig) -> list[str]:
    trainer = cfg.trainer
    if not isinstance(trainer.n_gpus_per_node, int):
        return []
    ranks = trainer.n_gpus_per_node * trainer.nnodes
    problems = []
    for section in SECTIONS:
        size = OmegaConf.select(cfg, f"{section}.fsdp_size", default=-1)
        if isinstance(size, bool) or not isinstance(size, int) or (size != -1 and size < 1):
            problems.append(f"{section}.fsdp_size={size!r} must be -1 (every rank) or a positive integer")
        elif size != -1 and size < ranks:
            problems.append(
                f"{section}.fsdp_size={size} is below the {ranks} workers (trainer.n_gpus_per_node x trainer.nnodes): "
                "hybrid sharding (shards within groups of that size, replicas across them) is not provided; set -1 "
                "to shard over every worker"
            )
    return problems


def drop_driver_keys(fsdp_config: dict[str, Any]) -> dict[str, Any]:
    """A worker's `fsdp_config` without the driver's keys."""
    fsdp_config.pop("fsdp_size", None)
    return fsdp_config
