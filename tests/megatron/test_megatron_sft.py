"""`update_actor_sft` on the Megatron actor equals the FSDP one: one RAFT step (same weights, seeds and
samples) gives the same kept responses, NLL and gradient norm on both backends (real Ray, CPU over gloo)."""

import pytest

from recipes import raft
from tests.e2e.conftest import run_overrides
from trainer.recipe_runner import load_recipe_config

pytest.importorskip("megatron.core", reason="install the [megatron] extra")
pytestmark = pytest.mark.slow


def test_first_raft_step_matches_the_fsdp_backend(ray_cluster, tiny_assets, tmp_path):
    common = ("trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.total_training_steps=1", "trainer.save_at_end=false")
    fsdp = raft.run(load_recipe_config(raft, run_overrides(tiny_assets, tmp_path / "fsdp", *common)))
    megatron = raft.run(load_recipe_config(raft, run_overrides(
        tiny_assets, tmp_path / "mcore", *common, "actor_rollout_ref.actor.strategy=megatron",
    )))
    for key in ("reward/mean", "raft/kept", "raft/kept_reward_mean", "actor/sft_loss", "actor/grad_norm", "actor/lr"):
        assert megatron[0][key] == pytest.approx(fsdp[0][key], rel=1e-4, abs=1e-6), key
