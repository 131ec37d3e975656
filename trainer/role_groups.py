"""The worker groups of a PPO-family run (actor/rollout/ref, optional critic), placed from config."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
from trainer.algorithm_settings import gen_batch_size
from trainer.cuda_alloc import gpu_worker_env
from trainer.rollout_source import RolloutSource
from trainer.worker_metrics import mean_over_workers
from trainer.worker_sections import actor_section, critic_section, reward_model_section
from workers.rollout.agent.rollout import absolute_specs
from workers.rollout.separate_sync import IpcRolloutSync, SeparateWeightSync, rollout_weight_sync

ACTOR_DIR, CRITIC_DIR = "actor", "critic"
# Keys of the reward_model section that the driver reads (trainer/reward_settings.py), not the reward-model worker.


def use_gpu(cfg: DictConfig) -> bool:
    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())


def fill_total_steps(optim: dict[str, Any], cfg: DictConfig) -> None:
    """The scheduler's step count: the run's (counted at start when trainer.total_training_steps is null) unless
    the section sets its own. Seed and release_cached_blocks follow the trainer's keys in trainer.yaml."""
    if optim["total_training_steps"] is None:
        optim["total_training_steps"] = cfg.trainer.total_training_steps


def actor_worker_config(cfg: DictConfig) -> dict[str, Any]:
    """The actor/rollout/ref section as the worker takes it."""
    section = actor_section(cfg)
    fill_total_steps(section["actor"]["optim"], cfg)
    section["rollout"]["multi_turn"] = absolute_specs(section["rollout"]["multi_turn"])
    if section["rollout"]["max_model_len"] is None:
        section["rollout"]["max_model_len"] = cfg.data.max_prompt_length + cfg.data.max_response_length
    if section["rollout"]["cuda_graph_max_batch"] is None:
        section["rollout"]["cuda_graph_max_batch"] = engine_decode_batch(cfg)
    if section["rollout"]["engine_process"] is None:
        section["rollout"]["engine_process"] = engine_in_own_process(cfg)
    return section


def engine_in_own_process(cfg: DictConfig) -> bool:
    """Whether a vLLM engine's core runs in a process of its own: for separate engines on devices of their own
    (weights by broadcast), so that the busy engine's Python does not hold the worker's GIL while the driver
    polls it; not where the trainer hands the engine tensors in its process (hybrid) or by CUDA IPC (an engine
    on a share of the trainer's GPU: `rollout.gpus_per_engine` below 1)."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name != "vllm" or rollout.placement != "separate":
        return False
    shares_trainer_gpu = use_gpu(cfg) and rollout.get("gpus_per_engine") is not None and rollout.gpus_per_engine < 1
    return not shares_trainer_gpu


def engine_decode_batch(cfg: DictConfig) -> int:
    """The most sequences one vLLM engine decodes at once in a step: the generation batch's responses over the
    engines (in the hybrid placement one per group of tensor_model_parallel_size actor ranks, which decodes the
    group's rows together). CUDA graphs are captured up to this batch only.
    With rollout.async_training=true the stream keeps up to (max_staleness + 1) batches of prompt groups out
    (trainer/async_rollout.py), all of them generating at once while the pipeline fills or after a hand-out:
    a decode batch past the largest graph runs without CUDA graphs."""
    rollout = cfg.actor_rollout_ref.rollout
    prompts = gen_batch_size(cfg)
    if rollout.get("async_training", False):
        prompts = (int(rollout.max_staleness) + 1) * cfg.data.train_batch_size
    hybrid_engines = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes // int(rollout.tensor_model_parallel_size)
    engines = rollout.num_engines if rollout.placement == "separate" else max(1, hybrid_engines)
    return max(1, -(-prompts * rollout.n // engines))


def critic_worker_config(cfg: DictConfig) -> dict[str, Any]:
    section = critic_section(cfg)
    fill_total_steps(section["optim"], cfg)
    return section


def reward_model_worker_config(cfg: DictConfig) -> dict[str, Any]:
    section = reward_model_section(cfg)
    if not section["model"]["path"]:
        raise ValueError("reward_model.enable=true needs reward_model.model.path (a Hugging Face model folder)")
    return section


def worker_classes(cfg: DictConfig) -> tuple[type, type]:
    """The actor/rollout/ref and critic worker classes of the configured training backends."""
    # One class each: actor.strategy / critic.strategy pick the backend inside.
    from workers.actor import ActorRolloutRefWorker
    from workers.critic import CriticWorker

    return ActorRolloutRefWorker, CriticWorker


HF_MODEL_DIR = "huggingface"  # verl's folder name for the Hugging Face model inside a role's checkpoint


def hf_checkpoint_roles(cfg: DictConfig) -> frozenset[str]:
    """The role folders whose checkpoints also hold a Hugging Face model (`checkpoint.save_contents` lists
    `hf_model`)."""
    sections = {ACTOR_DIR: cfg.actor_rollout_ref.actor, CRITIC_DIR: cfg.critic}
    return frozenset(role for role, section in sections.items() if "hf_model" in section.checkpoint.save_contents)


@dataclass
class RoleGroups:
    actor: RayWorkerGroup
    critic: RayWorkerGroup | None
    uses_reference: bool
    pools: list[RayResourcePool]
    rollout_source: RolloutSource  # sync + generate for every caller (the separate engines' group inside)
    reward_model: RayWorkerGroup | None = None
    groups: list[RayWorkerGroup] = field(default_factory=list)  # the groups owning actors (not role views)
    # verl's checkpoint.save_contents with `hf_model`: each checkpoint also holds that role's Hugging Face model.
    hf_in_checkpoint: frozenset[str] = frozenset()

    @classmethod
    def build(cls, cfg: DictConfig, reference: bool | None = None, critic: bool | None = None) -> "RoleGroups":
        """Create and initialise the groups; `reference`/`critic` override what the algorithm implies."""
        from workers.fsdp.reward_model import RewardModelWorker

        ActorRolloutRefWorker, CriticWorker = worker_classes(cfg)

        algo = cfg.algorithm
        uses_reference = (
            bool(cfg.actor_rollout_ref.actor.use_kl_loss or algo.use_kl_in_reward) if reference is None else reference
        )
        uses_critic = algo.adv_estimator == "gae" if critic is None else critic
        actor_cls = RayClassWithInitArgs(
            ActorRolloutRefWorker,
            config=actor_worker_config(cfg),
            role="actor_rollout_ref" if uses_reference else "actor_rollout",
        )
        critic_cls = RayClassWithInitArgs(CriticWorker, config=critic_worker_config(cfg)) if uses_critic else None
        rm_cls = (
            RayClassWithInitArgs(RewardModelWorker, config=reward_model_worker_config(cfg))
            if cfg.reward_model.enable
            else None
        )
        extra_roles = {name: c for name, c in (("critic", critic_cls), ("reward_model", rm_cls)) if c is not None}

        timeout = cfg.trainer.get("call_timeout_s")
        pools: list[RayResourcePool] = []
        groups: list[RayWorkerGroup] = []

        def new_pool(name: str) -> RayResourcePool:
            pools.append(RayResourcePool(
                [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes, use_gpu=use_gpu(cfg), name_prefix=name,
                gpus_per_process=cfg.trainer.get("gpus_per_process", 1),
            ))
            return pools[-1]

        def new_group(pool: RayResourcePool, role_cls: RayClassWithInitArgs, name: str) -> RayWorkerGroup:
            # Every group's processes start side by side; `started` waits for them all.
            groups.append(RayWorkerGroup(
                pool, role_cls, name_prefix=name, call_timeout_s=timeout, wait_started=False,
                worker_env=gpu_worker_env(cfg, use_gpu(cfg)),
            ))
            return groups[-1]

        def started() -> None:
            for group in groups:
                group.wait_started()
                print(f"worker group {group.name!r}: {group.describe_placement()}", flush=True)

        try:
            if cfg.trainer.placement == "colocated":
                fused = new_group(
                    new_pool("all_roles_"), create_colocated_worker_cls({"actor": actor_cls, **extra_roles}), "roles"
                )
            else:
                by_role = {"actor": new_group(new_pool("actor_"), actor_cls, "actor")}
                by_role.update({name: new_group(new_pool(f"{name}_"), c, name) for name, c in extra_roles.items()})
            rollout = cls._separate_rollout(cfg, new_group, pools)
            started()
            if cfg.trainer.placement == "colocated":
                by_role = fused.spawn()  # per-role views of the fused actors
            actor = by_role["actor"]
            for group in (actor, by_role.get("critic"), by_role.get("reward_model"), rollout):
                if group is not None:
                    group.init_model()
            source = RolloutSource(actor, rollout, cls._weight_sync(cfg, actor, rollout))
        except BaseException:
            # Whatever was reserved before the failure (or Ctrl-C) is given back before the error propagates.
            release(groups, pools)
            raise
        return cls(
            actor, by_role.get("critic"), uses_reference, pools, source, by_role.get("reward_model"),
            groups=groups, hf_in_checkpoint=hf_checkpoint_roles(cfg),
        )

    @staticmethod
    def _weight_sync(
        cfg: DictConfig, actor: RayWorkerGroup, rollout: RayWorkerGroup | None
    ) -> SeparateWeightSync | IpcRolloutSync | None:
        """The connected weight sync into the separate engines (none without them: the actor's own engine)."""
        if rollout is None:
            return None
        sync = rollout_weight_sync(
            actor, rollout, actor_worker_config(cfg)["rollout"], cfg.actor_rollout_ref.model.path, use_gpu(cfg),
            # A LoRA engine starts without the adapter: the first sync sends it (checked by the probe).
            engines_start_from_trainer=cfg.actor_rollout_ref.model.lora_rank == 0,
        )
        sync.connect()
        return sync

    @staticmethod
    def _separate_rollout(cfg: DictConfig, new_group: Any, pools: list[RayResourcePool]) -> RayWorkerGroup | None:
        """The vLLM engines' group of rollout.placement=separate (none otherwise)."""
        from workers.rollout.vllm_worker import VLLMRolloutWorker

        rollout = cfg.actor_rollout_ref.rollout
        if rollout.name != "vllm" or rollout.placement != "separate":
            return None
        gpus = rollout.get("gpus_per_engine") or rollout.tensor_model_parallel_size
        pools.append(
            RayResourcePool([rollout.num_engines], use_gpu=use_gpu(cfg), name_prefix="rollout_", gpus_per_process=gpus)
        )
        return new_group(pools[-1], RayClassWithInitArgs(VLLMRolloutWorker, config=actor_worker_config(cfg)), "rollout")

    # ---- the step's logs ------------------------------------------------------------------------------------
    def pop_worker_metrics(self) -> dict[str, float]:
        """Weight-sync, engine and per-phase memory metrics the workers gathered since the last call."""
        metrics = mean_over_workers(self.actor.pop_step_metrics())
        metrics.update(self.rollout_source.pop_metrics())
        return metrics

    def pop_exec_seconds(self) -> dict[str, list[list[tuple[str, float]]]]:
        """Per group, each rank's `(method, seconds inside it)` since the last pop (see trainer/overhead.py)."""
        groups = [g for g in (self.actor, self.critic, self.reward_model) if g is not None]
        records = {group.name: group.execute_all("sc_pop_exec_seconds") for group in groups}
        records.update(self.rollout_source.pop_exec_seconds())
        return records

    def _trained(self) -> list[tuple[str, RayWorkerGroup]]:
        """The checkpointed groups with their folder names."""
        groups = ((ACTOR_DIR, self.actor), (CRITIC_DIR, self.critic))
        return [(name, group) for name, group in groups if group is not None]

    def save(self, folder: Path) -> None:
        for name, group in self._trained():
            group.save_checkpoint(str(folder / name))
            if name in self.hf_in_checkpoint:
                group.export_hf(str(folder / name / HF_MODEL_DIR))

    def load(self, folder: Path) -> None:
        for name, group in self._trained():
            group.load_checkpoint(str(folder / name))

    def close(self) -> None:
        """At a run's end, before `shutdown`: each worker frees what it holds outside its memory (a vLLM engine's
        shared memory and processes), which a kill would leave behind on the machine."""
        for group in self.groups:
            unfinished = group.close()
            if unfinished:
                print(f"warning: ranks {unfinished} of {group.name!r} did not close before the shutdown; they are "
                      "killed as they are (a vLLM engine's /dev/shm queues may stay)", file=sys.stderr)

    def shutdown(self) -> None:
        """Kill the workers and give their placement groups back; safe to call twice."""
        release(self.groups, self.pools)
        self.groups, self.pools = [], []


def release(groups: list[RayWorkerGroup], pools: list[RayResourcePool]) -> None:
    """Kill `groups`' actors and remove `pools`' placement groups, going on past individual failures so
    that one error (e.g. Ray already shut down) does not keep the rest reserved."""
    for item, stop in [*((g, g.kill) for g in groups), *((p, p.release) for p in pools)]:
        try:
            stop()
        except Exception as error:  # noqa: BLE001 - cleanup must reach every item
            print(f"warning: could not release {item!r}: {type(error).__name__}: {error}", file=sys.stderr)
