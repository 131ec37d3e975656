"""`trainer.main` on 2 CPU workers with Ulysses sequence parallelism (actor, reference and critic: k=2, one
data-parallel group) runs, and its first step's metrics equal those of the same run at k=1 (2 data-parallel
ranks): the same rollouts, log-probs, values, losses and gradient norms."""

import math

import pytest

from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow

SHARED = (
    "algorithm=ppo", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=2",
    "trainer.test_freq=-1", "trainer.val_before_train=false",
    "trainer.save_at_end=false",
    # One mini-batch per step and micro-batches of one row: the metrics averaged over micro-batches are then
    # averages over the same rows whether a rank holds half of them (k=1) or a group holds all (k=2).
    "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
)
SEQUENCE_PARALLEL = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
)


def test_ulysses_run_matches_the_data_parallel_run(ray_cluster, tiny_assets, tmp_path):
    records = {}
    # k=2 runs 2 steps (the second from weights it trained); k=1 only the step compared (a constant learning rate: the step count changes no step before it)
    runs = (("k1", ("trainer.total_training_steps=1",)), ("k2", ("trainer.total_training_steps=2", *SEQUENCE_PARALLEL)))
    for name, extra in runs:
        records[name] = run(load_config(run_overrides(tiny_assets, tmp_path / name, *SHARED, *extra)))
    assert len(records["k2"]) == 2
    first_k1, first_k2 = records["k1"][0], records["k2"][0]
    compared = [k for k in first_k1 if k.startswith(("actor/", "critic/", "reward/", "advantage/", "response/"))]
    assert {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"} <= set(compared)
    for key in compared:
        assert math.isfinite(first_k2[key]) and first_k2[key] == pytest.approx(first_k1[key], abs=1e-5), key
