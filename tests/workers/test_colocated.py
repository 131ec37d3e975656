"""Actor and critic colocated in one process per rank (the trainer's default placement)."""

from __future__ import annotations

import torch

from single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from tests.workers.helpers import CALL_TIMEOUT_S, actor_config, random_prompts
from workers.fsdp import ActorRolloutRefWorker, CriticWorker


def test_colocated_actor_and_critic_share_processes(pool_2, tiny_model_dir):
    critic_config = {"seed": 3, "model": {"path": tiny_model_dir}, "optim": {"lr": 1e-3}, "ppo_mini_batch_size": 4}
    roles = create_colocated_worker_cls({
        "actor": RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_config(tiny_model_dir), role="actor_rollout"),
        "critic": RayClassWithInitArgs(CriticWorker, config=critic_config),
    })
    group = RayWorkerGroup(pool_2, roles, call_timeout_s=CALL_TIMEOUT_S)
    try:
        views = group.spawn()
        actor, critic = views["actor"], views["critic"]
        actor.init_model()
        critic.init_model()
        data = actor.generate_sequences(random_prompts(4, [2, 5], seed=0))
        data = data.union(actor.compute_log_prob(data)).union(critic.compute_values(data))
        data.batch["advantages"] = torch.ones_like(data.batch["old_log_probs"])
        data.batch["returns"] = torch.ones_like(data.batch["values"])
        assert {"vf_loss", "grad_norm"} <= set(critic.update_critic(data)[0])
        assert {"pg_loss", "grad_norm"} <= set(actor.update_actor(data)[0])
    finally:
        group.kill()
