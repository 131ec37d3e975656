"""The worker groups of a preference recipe: the actor (generator + policy + frozen reference) and an
optional reward-model verifier, colocated on one resource pool or on one pool each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
from trainer.role_groups import ACTOR_DIR, actor_worker_config, reward_model_worker_config, use_gpu


@dataclass
class PreferenceGroups:
    actor: RayWorkerGroup  # role actor_rollout_ref: generate_sequences, compute_ref_log_prob, update_actor_dpo
    reward_model: RayWorkerGroup | None  # compute_rm_score, when reward.reward_model.enable
    pools: list[RayResourcePool]

    @classmethod
    def build(cls, cfg: DictConfig) -> "PreferenceGroups":
        from workers.fsdp import ActorRolloutRefWorker, RewardModelWorker

        classes = {"actor": RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_worker_config(cfg), role="actor_rollout_ref")}
        if cfg.reward.reward_model.enable:
            classes["reward_model"] = RayClassWithInitArgs(RewardModelWorker, config=reward_model_worker_config(cfg))

        def new_pool(name: str) -> RayResourcePool:
            return RayResourcePool([cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes, use_gpu=use_gpu(cfg), name_prefix=name)

        if cfg.trainer.placement == "colocated":  # one process per slot holds every role
            pools = [new_pool("preference_roles_")]
            views = RayWorkerGroup(pools[0], create_colocated_worker_cls(classes), name_prefix="preference").spawn()
        else:
            pools = [new_pool(f"{role}_") for role in classes]
            views = {role: RayWorkerGroup(pool, cia, name_prefix=role) for (role, cia), pool in zip(classes.items(), pools)}
        for group in views.values():
            group.init_model()
        return cls(views["actor"], views.get("reward_model"), pools)

    def save(self, folder: Path) -> None:
        self.actor.save_checkpoint(str(folder / ACTOR_DIR))  # the reference and the reward model are frozen

    def load(self, folder: Path) -> None:
        self.actor.load_checkpoint(str(folder / ACTOR_DIR))

    def shutdown(self) -> None:
        for pool in self.pools:
            pool.release()
