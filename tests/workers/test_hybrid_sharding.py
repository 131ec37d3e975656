"""Hybrid sharding (`fsdp_config.fsdp_size` below the ranks) through the Ray worker groups on CPU: four ranks in
two shard groups of two give the log-probs, update metrics and updated weights of plain FSDP over the four, within
float32 noise; a checkpoint saved with the groups loads into plain FSDP (DCP reshards it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from single_controller.ray import RayResourcePool
from tests.workers.helpers import actor_config, make_group, update_batch
from workers.fsdp import ActorRolloutRefWorker

ATOL = 1e-5
RANKS = 4


@pytest.fixture(scope="module")
def pool_4(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[RANKS], use_gpu=False)
    yield pool
    pool.release()


def _actor_group(pool: RayResourcePool, model_dir: str, fsdp_size: int):
    config = actor_config(
        model_dir,
        # Two micro-batches per rank: the replicas sum their gradient shards after the second only.
        actor={"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 1, "optim": {"eps": 1e-4},
               "fsdp_config": {"fsdp_size": fsdp_size}},
        rollout={"n": 1},
    )
    return make_group(pool, ActorRolloutRefWorker, config, "actor_rollout")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_two_shard_groups_of_two_equal_fsdp_over_four_ranks_and_share_its_checkpoints(pool_4, tiny_model_dir, tmp_path):
    data = update_batch([9, 8, 9, 7, 2, 3, 1, 2], [12, 11, 12, 10, 3, 1, 3, 2])  # uneven rows
    mask = data.batch["response_mask"].bool()
    runs = {}
    for fsdp_size in (2, -1):
        group = _actor_group(pool_4, tiny_model_dir, fsdp_size)
        try:
            shard_ranks = group.pop_step_metrics()[0]["actor/fsdp_shard_ranks"]  # what init measured
            old = group.compute_log_prob(data)
            metrics = group.update_actor(data)[0]
            group.export_hf(str(tmp_path / f"updated_{fsdp_size}"))
            if fsdp_size == 2:
                group.save_checkpoint(str(tmp_path / "checkpoint"))
            else:  # plain FSDP reads the checkpoint the groups wrote
                group.load_checkpoint(str(tmp_path / "checkpoint"))
                group.export_hf(str(tmp_path / "loaded"))
        finally:
            group.kill()
        runs[fsdp_size] = (shard_ranks, old, metrics)
    (ranks_groups, old_groups, metrics_groups), (ranks_all, old_all, metrics_all) = runs[2], runs[-1]
    assert (ranks_groups, ranks_all) == (2, RANKS)
    torch.testing.assert_close(old_groups.batch["old_log_probs"][mask], old_all.batch["old_log_probs"][mask],
                               atol=ATOL, rtol=0)
    for key in ("pg_loss", "ppo_kl", "grad_norm"):
        assert metrics_groups[key] == pytest.approx(metrics_all[key], abs=ATOL), key
    start = _weights(Path(tiny_model_dir))
    updated_groups, updated_all = _weights(tmp_path / "updated_2"), _weights(tmp_path / "updated_-1")
    assert max(float((updated_all[k] - start[k]).abs().max()) for k in updated_all if k in start) > 1e-4  # moved
    for key, value in updated_all.items():
        torch.testing.assert_close(updated_groups[key], value, atol=ATOL, rtol=0, msg=key)
    loaded = _weights(tmp_path / "loaded")
    for key, value in updated_groups.items():
        assert torch.equal(loaded[key], value), key
