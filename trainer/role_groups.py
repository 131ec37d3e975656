"""The worker groups of a PPO-family run (actor/rollout/ref, optional critic), placed from config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls

ACTOR_DIR, CRITIC_DIR = "actor", "critic"


def use_gpu(cfg: DictConfig) -> bool:
    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())


def actor_worker_config(cfg: DictConfig) -> dict[str, Any]:
    """The actor/rollout/ref section as the worker takes it (mini-batches counted in responses)."""
    section = OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)
    n = cfg.actor_rollout_ref.rollout.n
    section["actor"]["ppo_mini_batch_size"] = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n
    section["actor"]["optim"]["total_training_steps"] = cfg.trainer.total_training_steps
    section["seed"] = cfg.trainer.seed
    return section


def critic_worker_config(cfg: DictConfig) -> dict[str, Any]:
    section = OmegaConf.to_container(cfg.critic, resolve=True)
    section["ppo_mini_batch_size"] = cfg.critic.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    section["optim"]["total_training_steps"] = cfg.trainer.total_training_steps
    section["seed"] = cfg.trainer.seed
    return section


@dataclass
class RoleGroups:
    actor: RayWorkerGroup
    critic: RayWorkerGroup | None
    uses_reference: bool
    pools: list[RayResourcePool]

    @classmethod
    def build(cls, cfg: DictConfig) -> "RoleGroups":
        from workers.fsdp.actor_rollout_ref import ActorRolloutRefWorker
        from workers.fsdp.critic import CriticWorker

        algo = cfg.algorithm
        uses_reference = bool(algo.use_kl_loss or algo.use_kl_in_reward)
        uses_critic = algo.adv_estimator == "gae"
        actor_cls = RayClassWithInitArgs(
            ActorRolloutRefWorker, config=actor_worker_config(cfg), role="actor_rollout_ref" if uses_reference else "actor_rollout"
        )
        critic_cls = RayClassWithInitArgs(CriticWorker, config=critic_worker_config(cfg)) if uses_critic else None

        def new_pool(name: str) -> RayResourcePool:
            return RayResourcePool([cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes, use_gpu=use_gpu(cfg), name_prefix=name)

        if cfg.trainer.placement == "colocated":
            pool = new_pool("all_roles_")
            role_classes = {"actor": actor_cls, **({"critic": critic_cls} if critic_cls else {})}
            views = RayWorkerGroup(pool, create_colocated_worker_cls(role_classes), name_prefix="roles").spawn()
            groups = cls(views["actor"], views.get("critic"), uses_reference, [pool])
        else:
            pools = [new_pool("actor_")]
            actor = RayWorkerGroup(pools[0], actor_cls, name_prefix="actor")
            critic = None
            if critic_cls:
                pools.append(new_pool("critic_"))
                critic = RayWorkerGroup(pools[1], critic_cls, name_prefix="critic")
            groups = cls(actor, critic, uses_reference, pools)
        groups.actor.init_model()
        if groups.critic is not None:
            groups.critic.init_model()
        return groups

    def save(self, folder: Path) -> None:
        self.actor.save_checkpoint(str(folder / ACTOR_DIR))
        if self.critic is not None:
            self.critic.save_checkpoint(str(folder / CRITIC_DIR))

    def load(self, folder: Path) -> None:
        self.actor.load_checkpoint(str(folder / ACTOR_DIR))
        if self.critic is not None:
            self.critic.load_checkpoint(str(folder / CRITIC_DIR))

    def shutdown(self) -> None:
        for pool in self.pools:
            pool.release()
