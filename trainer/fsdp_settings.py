"""verl's `fsdp_config.fsdp_size` (actor, reference, critic): the number of ranks in each FSDP shard group. -1, or at
least the role's ranks, shards over all of them; a smaller size must divide the ranks: hybrid sharding, where each
group of that many consecutive ranks holds one sharded copy and the groups are replicas (workers/fsdp/wrap.py). The
workers check the value's type; the rank count is the driver's to check, before anything starts."""

from __future__ import annotations

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
        if isinstance(size, int) and not isinstance(size, bool) and 1 <= size < ranks and ranks % size:
            problems.append(
                f"{section}.fsdp_size={size} does not divide the {ranks} workers (trainer.n_gpus_per_node x "
                "trainer.nnodes): hybrid sharding makes groups of that many ranks; use a divisor of the workers, or -1 "
                "to shard over every worker"
            )
    return problems
