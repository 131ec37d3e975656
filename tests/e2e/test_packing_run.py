"""`trainer.main` with token-budget micro-batches on every role (actor, reference, critic, reward model),
packed forwards (the default): the config reaches the workers and a PPO step runs."""

import numpy as np
import pytest

from tests.e2e.conftest import ONE_RANK, run_overrides
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow


def test_ppo_step_with_token_budgets_on_every_role(ray_cluster, tiny_assets, tmp_path):
    budget = 80  # tokens: one sequence is at most 64 + 8, so micro-batches hold one or a few rows
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, "algorithm=ppo", "trainer.total_training_steps=1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_at_end=false",
        ONE_RANK,  # budgets over two ranks (each rank's micro-batch count agreed): tests/workers/test_packing_workers.py
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={2 * budget}",
        f"critic.ppo_max_token_len_per_gpu={budget}", f"critic.forward_max_token_len_per_gpu={2 * budget}",
        "reward_model.enable=true", f"reward_model.model.path={tiny_assets['model']}",
        f"reward_model.forward_max_token_len_per_gpu={2 * budget}",
    ))
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz and cfg.critic.use_dynamic_bsz and cfg.reward_model.use_dynamic_bsz
    (record,) = run(cfg)
    for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "reward/reward_model_mean", "advantage/mean"):
        assert np.isfinite(record[key]) and record[key] != 0.0, (key, record)
