"""End-to-end runs of `trainer.main` on the shared Ray cluster: GRPO learns, PPO with a critic runs,
a resumed run reproduces a straight one exactly, and the straight run's metrics.jsonl carries the MFU metrics."""

import json

import numpy as np
import pytest

from tests.e2e.conftest import ONE_RANK, comparable_metrics, run_overrides
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow


def _train_rewards(history):
    return [r["reward/mean"] for r in history if "reward/mean" in r]


def test_grpo_reward_improves(ray_cluster, tiny_assets, tmp_path):
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, ONE_RANK, "trainer.total_training_steps=14", "trainer.test_freq=7",
        "actor_rollout_ref.actor.optim.lr=5e-3", "trainer.save_at_end=false",
    ))
    history = run(cfg)
    rewards = _train_rewards(history)
    assert len(rewards) == 14
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.1, rewards
    val = [r["val/reward_mean"] for r in history if "val/reward_mean" in r]
    assert len(val) == 3  # before training, at step 7 and at step 14
    assert (tmp_path / "logs" / "metrics.jsonl").is_file() and (tmp_path / "logs" / "reward_curve.png").is_file()


def test_ppo_with_critic_runs(ray_cluster, tiny_assets, tmp_path):
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, ONE_RANK, "algorithm=ppo", "trainer.total_training_steps=3", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.placement=separate",
        # verl's spelling of "each checkpoint also holds the Hugging Face models"
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
        "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.critic_warmup=1",  # verl's key: step 1 updates only the critic
    ))
    history = run(cfg)
    assert [record["step"] for record in history] == [1, 2, 3]
    assert [record["actor/updated"] for record in history] == [0.0, 1.0, 1.0]
    assert ["actor/pg_loss" in record for record in history] == [False, True, True]
    assert ["timing/update_actor_s" in record for record in history] == [False, True, True]
    for record in history:
        keys = ("critic/vf_loss", "reward/mean", "timing/values_s", "timing/update_critic_s")
        for key in keys + (("actor/pg_loss",) if record["step"] > 1 else ()):
            assert np.isfinite(record[key]), (key, record)
        # the calls collecting the workers' metrics after the phases, outside timing/step_s but inside the wall time
        assert 0 < record["timing/worker_metrics_s"] < record["timing/wall_step_s"] - record["timing/step_s"] + 1e-3, record
    assert (tmp_path / "global_step_3" / "critic").is_dir()
    for role in ("actor", "critic"):
        hf_model = tmp_path / "global_step_3" / role / "huggingface"
        assert (hf_model / "config.json").is_file() and list(hf_model.glob("*.safetensors")), role


# The straight and the resumed runs: two ranks, each step's MFU counted against a CPU-sized peak (there is none on
# CPU otherwise), a save at step 2.
PEAK_TFLOPS = 0.01
RUN_SETTINGS = ("trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=2", "trainer.device=cpu",
                "trainer.n_gpus_per_node=2", f"trainer.device_peak_tflops={PEAK_TFLOPS}")
MFU_PHASES = ("generate", "old_log_prob", "ref_log_prob", "update_actor")


@pytest.fixture(scope="module")
def straight_run(ray_cluster, tiny_assets, tmp_path_factory):
    """(history, output folder) of three steps run straight through: the resume test's reference, whose
    metrics.jsonl the MFU test reads (one run for both)."""
    out = tmp_path_factory.mktemp("straight")
    return run(load_config(run_overrides(tiny_assets, out, "trainer.total_training_steps=3", *RUN_SETTINGS))), out


def test_resume_reproduces_a_straight_run(straight_run, tiny_assets, tmp_path):
    straight, _ = straight_run
    first = run(load_config(run_overrides(tiny_assets, tmp_path / "resumed", "trainer.total_training_steps=2", *RUN_SETTINGS)))
    second = run(load_config(run_overrides(tiny_assets, tmp_path / "resumed", "trainer.total_training_steps=3", *RUN_SETTINGS)))
    assert [r["step"] for r in second] == [3]
    assert comparable_metrics(first + second) == comparable_metrics(straight)
    logged = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]


def test_mfu_in_metrics_jsonl(straight_run):
    """Each MFU metric is its phase's model FLOPs over the phase's time, GPUs (here worker processes) and peak."""
    _, out = straight_run
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/tokens" in r]
    assert len(steps) == 3
    for record in steps:
        assert record["perf/device_peak_tflops"] == PEAK_TFLOPS and record["perf/gpus"] == 2
        assert record["perf/tokens_per_s_per_gpu"] == pytest.approx(record["perf/tokens_per_s"] / 2)
        for phase in MFU_PHASES:
            expected = record[f"perf/tflop/{phase}"] / (record[f"timing/{phase}_s"] * 2 * PEAK_TFLOPS)
            assert 0 < record[f"perf/mfu/{phase}"] == pytest.approx(expected)
        assert record["perf/tflop/update_actor"] == pytest.approx(3 * record["perf/tflop/old_log_prob"])
        assert "perf/hfu/update_actor" not in record  # no gradient checkpointing: nothing recomputed


def _check_estimator_step(record, cfg, algorithm):
    assert np.isfinite(record["actor/pg_loss"]) and np.isfinite(record["advantage/mean"])
    if algorithm == "remax":
        assert record["timing/generate_baseline_s"] > 0
    if cfg.algorithm.use_kl_in_reward:
        assert "actor/reward_kl_penalty" in record


def test_reward_model_group_scores_beside_rule_rewards_under_rloo(ray_cluster, tiny_assets, tmp_path):
    """One run for two checks: the reward-model group scores beside the rule rewards, and the rloo estimator runs
    its steps (the checks of test_other_estimators_run_a_step, whose run it replaces)."""
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, ONE_RANK, "algorithm=rloo", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_at_end=false",
        "reward_model.enable=true", f"reward_model.model.path={tiny_assets['model']}",
    ))
    history = run(cfg)
    assert len(history) == 2
    for record in history:
        # the reward-model group's scores
        assert np.isfinite(record["reward/reward_model_mean"]) and record["reward/reward_model_mean"] != 0.0
        assert np.isfinite(record["reward/mean"])
        # the rloo estimator (its KL in the reward included)
        _check_estimator_step(record, cfg, "rloo")
    assert cfg.algorithm.use_kl_in_reward  # rloo's default: the KL penalty check above did run


@pytest.mark.parametrize("algorithm", ["reinforce_pp", "remax"])  # rloo: with the reward model above
def test_other_estimators_run_a_step(ray_cluster, tiny_assets, tmp_path, algorithm):
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, ONE_RANK, f"algorithm={algorithm}", "trainer.total_training_steps=1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_at_end=false",
    ))
    (record,) = run(cfg)
    _check_estimator_step(record, cfg, algorithm)
