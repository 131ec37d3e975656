"""End-to-end `recipes.online_dpo` on the shared Ray cluster: reward and implicit-reward accuracy go up,
metrics and checkpoints are written; the reward-model verifier path runs."""

import numpy as np
import pytest

from recipes.config import load_recipe_config
from recipes.online_dpo import run
from tests.e2e.conftest import ONE_RANK, run_overrides

pytestmark = pytest.mark.slow
METRICS = ("dpo/loss", "dpo/accuracy", "dpo/margin", "dpo/chosen_logps", "dpo/rejected_logps", "reward/mean", "pairs/formed", "pairs/dropped")


def test_online_dpo_lifts_reward_and_accuracy(ray_cluster, tiny_assets, tmp_path):
    cfg = load_recipe_config("online_dpo", run_overrides(
        tiny_assets, tmp_path, "trainer.total_training_steps=14", "trainer.test_freq=-1", "trainer.val_before_train=false",
    ))
    history = run(cfg)
    assert [r["step"] for r in history] == list(range(1, 15))
    for record in history:
        assert all(np.isfinite(record[key]) for key in METRICS), record
        assert record["pairs/formed"] + record["pairs/dropped"] == cfg.data.train_batch_size
    reward = [r["reward/mean"] for r in history]
    accuracy = [r["dpo/accuracy"] for r in history]
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.1, reward
    assert np.mean(accuracy[-3:]) > np.mean(accuracy[:3]) + 0.2, accuracy
    assert (tmp_path / "global_step_14" / "actor").is_dir()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "14"
    assert (tmp_path / "logs" / "metrics.jsonl").is_file()


def test_reward_model_verifier_forms_the_pairs(ray_cluster, tiny_assets, tmp_path):
    cfg = load_recipe_config("online_dpo", run_overrides(
        tiny_assets, tmp_path, ONE_RANK, "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_at_end=false", "reward_model.enable=true",
        f"reward_model.model.path={tiny_assets['model']}", "trainer.placement=separate",
    ))
    history = run(cfg)
    assert len(history) == 2
    for record in history:
        assert np.isfinite(record["reward/verifier_mean"]) and np.isfinite(record["reward/mean"])
        assert record["pairs/formed"] == cfg.data.train_batch_size  # a random score head never ties
        assert np.isfinite(record["dpo/loss"])
