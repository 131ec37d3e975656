"""DAPO, GSPO and Dr. GRPO end to end on the shared Ray cluster: dynamic sampling trains only on groups whose
responses differ and draws extra batches for them, a run that drew extra batches resumes exactly, the DAPO
preset learns, and the GSPO and Dr. GRPO settings run on the FSDP actor."""

import textwrap

import numpy as np
import pytest

from tests.e2e.conftest import ONE_RANK, comparable_metrics, run_overrides
from trainer import checkpointing
from trainer.config_loader import load_config
from trainer.launch import run_loop
from trainer.main import run
from trainer.ppo_trainer import PPOTrainer
from trainer.role_groups import RoleGroups

pytestmark = pytest.mark.slow

QUIET = ("trainer.test_freq=-1", "trainer.val_before_train=false", ONE_RANK)
# 4 prompts x 4 responses per step; dynamic sampling on, no cap but one pass over the dataset.
FILTERED = (
    *QUIET, "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
    "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
)
# Dr. GRPO: advantages not divided by the group's std, token losses summed per response over a constant.
DR_GRPO = ("algorithm.norm_adv_by_std_in_grpo=false", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm")


@pytest.fixture
def half_uniform_reward(tmp_path):
    """Prompts of even dataset index score 0.5 whatever the response (their groups are uniform: filtered);
    the others get the task's own score (partial credit: their responses differ)."""
    path = tmp_path / "half_uniform.py"
    path.write_text(textwrap.dedent("""
        from trainer.rewards import compute_score as task_score

        def compute_score(data_source, solution_str, ground_truth, extra_info):
            if extra_info["index"] % 2 == 0:
                return 0.5
            return task_score(data_source, solution_str, ground_truth, extra_info)
    """))
    return f"custom_reward_function.path={path}"


class RecordingTrainer(PPOTrainer):
    """The trainer, keeping each step's training batch as dynamic sampling assembled it."""

    kept: list = []

    def _keep_mixed_groups(self, first, timer):
        scored, counts = super()._keep_mixed_groups(first, timer)
        RecordingTrainer.kept.append(scored)
        return scored, counts


def _check_mixed_groups_only(history, kept):
    all_uids = []
    for record, scored in zip(history, kept, strict=True):
        rollout = scored.rollout
        uids = rollout.non_tensor_batch["uid"]
        groups = list(dict.fromkeys(uids.tolist()))
        assert len(rollout) == 16 and len(groups) == 4  # exactly data.train_batch_size groups of rollout.n
        for uid in groups:
            rows = np.flatnonzero(uids == uid)
            assert len(rows) == 4 and np.std(scored.rule_scores[rows]) > 0  # mixed groups only
            assert all(info["index"] % 2 == 1 for info in rollout.non_tensor_batch["extra_info"][rows])
        # Half of every generated batch is uniform, so a batch of 4 mixed groups takes at least two.
        assert record["filter_groups/gen_batches"] >= 2 and record["filter_groups/uniform_groups"] >= 2
        assert record["filter_groups/topped_up_groups"] == 0
        assert record["filter_groups/mixed_groups"] - record["filter_groups/trimmed_groups"] == 4
        assert 0.0 < record["reward/generated_score_mean"] < 1.0 and np.isfinite(record["actor/pg_loss"])
        all_uids.extend(groups)
    assert len(set(all_uids)) == 4 * len(history)  # unique over draws and steps


def test_dynamic_sampling_keeps_mixed_groups_and_a_run_that_drew_extra_batches_resumes_exactly(
    ray_cluster, tiny_assets, tmp_path, half_uniform_reward, capsys
):
    """With Dr. GRPO's settings (they run on the FSDP actor here too). The resumed run's console line carries the
    step's filter_groups/* counts (as logged), and the run ends by naming its last checkpoint and its Hugging Face
    export."""
    common = (*FILTERED, *DR_GRPO, half_uniform_reward, "trainer.save_freq=2")
    RecordingTrainer.kept = []
    straight_cfg = load_config(run_overrides(tiny_assets, tmp_path / "straight", *common, "trainer.total_training_steps=3"))
    straight = run_loop(straight_cfg, RoleGroups.build, RecordingTrainer)
    _check_mixed_groups_only(straight, RecordingTrainer.kept)

    checkpoint = tmp_path / "straight" / "global_step_2"  # saved mid-run, as a run ending at step 2 would save it
    state = checkpointing.load_driver_state(checkpoint)
    drawn = sum(r["filter_groups/gen_batches"] for r in straight[:2])
    assert drawn >= 4 and state["dataloader"]["position"] == drawn  # the loader is past every batch drawn
    capsys.readouterr()  # the straight run's output
    resumed_dir = tmp_path / "resumed"
    resumed = run(load_config(run_overrides(
        tiny_assets, resumed_dir, *common, "trainer.total_training_steps=3", f"trainer.resume_mode={checkpoint}",
        "trainer.logger=[console,jsonl]", "trainer.export_hf_at_end=true",
    )))
    assert [r["step"] for r in resumed] == [3]
    assert comparable_metrics(resumed) == comparable_metrics(straight[2:])

    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("step 3:")]
    for key in ("filter_groups/mixed_groups", "filter_groups/uniform_groups", "filter_groups/gen_batches"):
        assert f"{key}={resumed[0][key]:.4g}" in line, line
    assert f"last checkpoint: {resumed_dir / 'global_step_3'}\nHugging Face export: {resumed_dir / 'hf_export'}\n" in out, out
    assert (resumed_dir / "hf_export" / "config.json").is_file()


def test_the_dapo_preset_learns(ray_cluster, tiny_assets, tmp_path):
    """algorithm=dapo on the tiny task: the overlong penalty first teaches the random model to stop (its
    responses run to the limit), then the task score rises."""
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, "algorithm=dapo", *QUIET, "trainer.total_training_steps=16", "trainer.save_at_end=false",
        "actor_rollout_ref.actor.optim.lr=5e-3",
    ))
    history = run(cfg)
    reward = [r["reward/mean"] for r in history]  # the task score plus the overlong penalty: what DAPO maximises
    score = [r["reward/generated_score_mean"] for r in history]
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.4, reward
    assert np.mean(score[-3:]) > np.mean(score[:3]), score
    assert history[0]["reward/overlong_penalty_mean"] < -0.5 < history[-1]["reward/overlong_penalty_mean"]
    assert all(r["filter_groups/gen_batches"] >= 1 for r in history)


def test_gspo_runs_on_the_fsdp_actor(ray_cluster, tiny_assets, tmp_path):
    common = (*QUIET, "trainer.total_training_steps=1", "trainer.save_at_end=false", "actor_rollout_ref.actor.ppo_epochs=2")
    vanilla = run(load_config(run_overrides(tiny_assets, tmp_path / "vanilla", *common)))[0]
    gspo = run(load_config(run_overrides(tiny_assets, tmp_path / "gspo", *common, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo")))[0]
    assert gspo["reward/mean"] == vanilla["reward/mean"]  # the same rollouts
    assert gspo["actor/pg_clipfrac_lower"] == 0.0  # GSPO has no dual clip
    assert gspo["actor/pg_loss"] != pytest.approx(vanilla["actor/pg_loss"], rel=1e-4)  # the second epoch's ratios differ
    assert np.isfinite(gspo["actor/grad_norm"]) and gspo["actor/grad_norm"] > 0
