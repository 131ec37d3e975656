"""`update_actor_sft` on the Megatron actor equals the FSDP one: one RAFT step (same weights, seeds and
samples) gives the same kept responses, NLL and gradient norm on both backends (real Ray, CPU over gloo). The FSDP
side is the first step of tests/recipes/test_raft.py's run (a constant learning rate: its step 1 is a 1-step run's)."""

import pytest

from recipes import raft
from tests.e2e.conftest import run_overrides
from trainer.recipe_runner import load_recipe_config

pytest.importorskip("megatron.core", reason="install the [megatron] extra")
pytestmark = pytest.mark.slow


def test_first_raft_step_matches_the_fsdp_backend(raft_run, tiny_assets, tmp_path):
    fsdp, _, _ = raft_run
    megatron = raft.run(load_recipe_config(raft, run_overrides(
        tiny_assets, tmp_path, "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.total_training_steps=1",
        "trainer.save_at_end=false", "actor_rollout_ref.actor.strategy=megatron",
    )))
    for key in ("reward/mean", "raft/kept", "raft/kept_reward_mean", "actor/sft_loss", "actor/grad_norm", "actor/lr"):
        assert megatron[0][key] == pytest.approx(fsdp[0][key], rel=1e-4, abs=1e-6), key
