"""A new worker beside the stock actor, driven from a plain loop (the worked example of docs/recipes.md).

    python -m recipes.custom_worker_example

`GroupJudge` scores responses with the rule reward (row-wise work: `Dispatch.DP_COMPUTE_PROTO`) and turns
the scores into group-relative advantages (work on whole prompt groups: a custom dispatch that keeps all
samples of a prompt on one rank and puts the rows back in order). The loop uses them for a policy step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls


def split_by_prompt(worker_group: Any, data: DataProto) -> tuple[tuple, dict]:
    """Dispatch: one chunk per rank holding whole prompt groups (by `uid`), each row tagged with its index."""
    uids = data.non_tensor_batch["uid"]
    prompts = list(dict.fromkeys(uids))
    chunks = []
    for share in np.array_split(np.arange(len(prompts)), worker_group.world_size):
        rows = np.flatnonzero(np.isin(uids, [prompts[i] for i in share]))
        chunk = data[rows]
        chunk.batch["row"] = torch.as_tensor(rows)
        chunks.append(chunk)
    return (chunks,), {}  # every positional argument becomes a list with one entry per rank


def concat_in_row_order(worker_group: Any, outputs: list[DataProto]) -> DataProto:
    """Collect: the ranks' outputs concatenated and sorted back into the input's row order."""
    merged = DataProto.concat(outputs)
    return merged.reorder(torch.argsort(merged.batch["row"]))


class GroupJudge(Worker):
    def __init__(self, model_path: str) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        from trainer.rewards import RuleRewardManager

        self.reward_fn = RuleRewardManager(AutoTokenizer.from_pretrained(model_path))

    @register(Dispatch.DP_COMPUTE_PROTO)
    def score(self, data: DataProto) -> DataProto:
        """`score` [B]: row-wise, so any split of the rows will do (padding is added and removed for us)."""
        token_scores, _ = self.reward_fn(data)
        return DataProto.from_dict({"score": token_scores.sum(-1)})

    @register(dispatch_mode={"dispatch_fn": split_by_prompt, "collect_fn": concat_in_row_order})
    def group_advantage(self, data: DataProto) -> DataProto:
        """`advantage` [B]: score minus the mean score of the same prompt's samples, all on this rank."""
        uids, score = data.non_tensor_batch["uid"], data.batch["score"]
        advantage = torch.zeros_like(score)
        for uid in set(uids):
            rows = torch.as_tensor(np.flatnonzero(uids == uid))
            advantage[rows] = score[rows] - score[rows].mean()
        return DataProto.from_dict({"advantage": advantage, "row": data.batch["row"]})


def run(overrides: list[str], steps: int = 4) -> list[dict[str, float]]:
    from transformers import AutoTokenizer

    from trainer.config_loader import load_config
    from trainer.data import RLDataset, make_dataloader
    from trainer.role_groups import actor_worker_config
    from trainer.rollout_source import RolloutSource
    from trainer.run_setup import ensure_default_assets, init_ray
    from workers.fsdp import ActorRolloutRefWorker

    cfg = load_config(
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.use_kl_loss=false",
            "data.train_batch_size=8",
            *overrides,
        ]
    )
    ensure_default_assets(cfg)
    init_ray(cfg)
    model_path, n = cfg.actor_rollout_ref.model.path, cfg.actor_rollout_ref.rollout.n
    # Beside the stock workers: one process per slot of the pool holds both the actor and the judge.
    pool = RayResourcePool([2], use_gpu=False)
    roles = create_colocated_worker_cls({
        "actor": RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_worker_config(cfg), role="actor_rollout"),
        "judge": RayClassWithInitArgs(GroupJudge, model_path=model_path),
    })
    views = RayWorkerGroup(pool, roles).spawn()
    actor, judge = views["actor"], views["judge"]
    actor.init_model()
    source = RolloutSource(actor)  # the actor's weights synced into its engine, then generated, as in every loop
    dataset = RLDataset(cfg.data.train_files, AutoTokenizer.from_pretrained(model_path), cfg.data.max_prompt_length)
    loader = make_dataloader(dataset, cfg.data.train_batch_size, seed=0)
    history = []
    try:
        for step in range(steps):
            batch = loader.next_batch()
            uids = np.array([f"{step}-{i}" for i in range(len(batch))], dtype=object)
            rollout = source.generate_sequences(batch.union(DataProto.from_dict(non_tensors={"uid": uids})).repeat(n))
            rollout.batch["score"] = judge.score(rollout).batch["score"]
            advantage = judge.group_advantage(rollout).batch["advantage"]
            rollout.batch["advantages"] = advantage[:, None] * rollout.batch["response_mask"]
            rollout = rollout.union(actor.compute_log_prob(rollout))
            metrics = actor.update_actor(rollout)[0]
            history.append({"score": float(rollout.batch["score"].mean()), "pg_loss": metrics["pg_loss"]})
            print(f"step {step}: score {history[-1]['score']:.3f}  pg_loss {metrics['pg_loss']:.4f}")
    finally:
        pool.release()
    return history


if __name__ == "__main__":
    run([])
