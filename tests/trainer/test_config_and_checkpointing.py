"""Trainer config errors, checkpoint folders written atomically, resume-folder lookup, tracking output."""

import json

import pytest

from trainer import checkpointing
from trainer.config_loader import ConfigError, load_config
from trainer.main import main
from trainer.tracking import Tracker


def test_defaults_and_algorithm_group():
    cfg = load_config()
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 8
    ppo = load_config(["algorithm=ppo", "actor_rollout_ref.actor.optim.lr=1e-4"])
    assert ppo.algorithm.adv_estimator == "gae" and ppo.actor_rollout_ref.actor.optim.lr == 1e-4
    # Interpolations are resolved: the critic follows the actor's model path.
    assert load_config(["actor_rollout_ref.model.path=/m"]).critic.model.path == "/m"


@pytest.mark.parametrize(
    "override,expected",
    [
        ("actor_rollout_ref.actor.optim.lrr=1", r"unknown config key 'actor_rollout_ref.actor.optim.lrr'; did you mean 'actor_rollout_ref.actor.optim.lr'\?"),
        ("nope=1", r"valid keys under the top level: \['actor_rollout_ref', 'algorithm'"),
        ("algorithm=nope", r"Available options in 'algorithm'[\s\S]*grpo"),
        ("trainer.placement=somewhere", r"trainer.placement='somewhere' is not valid; choose one of \['colocated', 'separate'\]"),
        ("data.train_batch_size=0", r"data.train_batch_size=0 must be a positive integer"),
        # the config accepts exactly the estimators the KL code has (it once listed 'full', which the code lacks)
        ("algorithm.kl_penalty=full", r"algorithm.kl_penalty='full' is not valid; choose one of \['kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3'\]"),
        ("data.train_batch_size=12", r"ppo_mini_batch_size=8 \(prompts\) must divide data.train_batch_size=12"),
        ("trainer.driver_threads=0", r"trainer.driver_threads=0 must be null \(torch's default, one per core\) or a positive integer"),
        ("trainer.cuda_alloc_conf=expandable_segments", r"trainer.cuda_alloc_conf=.expandable_segments. must be null .* name:value entries"),
        ("trainer.release_cached_blocks=sometimes", r"trainer.release_cached_blocks='sometimes' is not valid; choose one of \['after_micro_batch', 'after_phase'\]"),
        ("trainer.logger=[console,swanlab]", r"unknown entries \['swanlab'\]; valid are \['console', 'jsonl', 'tensorboard', 'wandb', 'mlflow'\]"),
    ],
)
def test_bad_overrides_name_the_problem_and_the_valid_choices(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config([override])


def test_the_driver_keeps_to_its_thread_count_while_the_run_lasts():
    import torch

    from trainer.run_setup import driver_threads

    before = torch.get_num_threads()
    with driver_threads(load_config(["trainer.driver_threads=3"])):
        assert torch.get_num_threads() == 3
        with driver_threads(load_config(["trainer.driver_threads=null"])):  # null: left as it is
            assert torch.get_num_threads() == 3
        with driver_threads(load_config([])):  # the default: one
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == before


def test_the_allocator_setting_reaches_gpu_workers_only():
    from trainer.cuda_alloc import ALLOC_CONF_VAR, gpu_worker_env

    cfg = load_config(["trainer.cuda_alloc_conf='expandable_segments:True,max_split_size_mb:512'"])
    assert gpu_worker_env(cfg, gpu=True) == {ALLOC_CONF_VAR: "expandable_segments:True,max_split_size_mb:512"}
    assert gpu_worker_env(cfg, gpu=False) == {}  # the CPU has no caching allocator
    assert gpu_worker_env(load_config(["trainer.cuda_alloc_conf=null"]), gpu=True) == {}  # null: environment kept


def test_every_fsdp_worker_gets_the_release_point():
    from trainer.role_groups import actor_worker_config, critic_worker_config
    from workers.config import actor_rollout_ref_config, critic_config

    assert actor_worker_config(load_config([]))["release_cached_blocks"] == "after_micro_batch"
    cfg = load_config(["trainer.release_cached_blocks=after_phase"])
    assert actor_rollout_ref_config(actor_worker_config(cfg))["release_cached_blocks"] == "after_phase"
    assert critic_config(critic_worker_config(cfg))["release_cached_blocks"] == "after_phase"


def test_cli_prints_config_and_rejects_bad_keys(capsys):
    assert main(["--cfg", "job", "algorithm=rloo"]) == 0
    assert "adv_estimator: rloo" in capsys.readouterr().out
    assert main(["trainer.bogus=1"]) == 2
    assert "valid keys under trainer" in capsys.readouterr().err


def test_checkpoint_folders_are_atomic_and_latest_is_found(tmp_path):
    def save_roles(folder):
        (folder / "actor").mkdir()
        (folder / "actor" / "weights").write_text("w")

    for step in (2, 4, 6):
        checkpointing.save_checkpoint(tmp_path, step, {"global_step": step}, save_roles, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "global_step_4", "global_step_6", "latest_checkpointed_iteration.txt",
    ]
    found = checkpointing.find_resume_dir(tmp_path, "auto")
    assert found.name == "global_step_6" and checkpointing.load_driver_state(found) == {"global_step": 6}
    assert checkpointing.find_resume_dir(tmp_path, "disable") is None
    assert checkpointing.find_resume_dir(tmp_path / "empty", "auto") is None


def test_failed_save_leaves_previous_checkpoint(tmp_path):
    checkpointing.save_checkpoint(tmp_path, 1, {"global_step": 1}, lambda folder: None)

    def crashing(folder):
        (folder / "partial").write_text("half")
        raise RuntimeError("worker died mid-save")

    with pytest.raises(RuntimeError):
        checkpointing.save_checkpoint(tmp_path, 2, {"global_step": 2}, crashing)
    assert not (tmp_path / "global_step_2").exists()
    assert checkpointing.find_resume_dir(tmp_path, "auto").name == "global_step_1"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint folder"):
        checkpointing.find_resume_dir(tmp_path, str(tmp_path / ".global_step_2.tmp"))


def test_tracker_writes_jsonl_tensorboard_and_reward_curve(tmp_path):
    lines = []
    tracker = Tracker(["console", "jsonl", "tensorboard"], tmp_path, print_fn=lines.append)
    for step in range(1, 4):
        tracker.log({"reward/mean": 0.1 * step, "timing/step_s": 1.0}, step)
    curve = tracker.plot_reward_curve(tmp_path / "curve.png")
    tracker.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and records[2]["reward/mean"] == pytest.approx(0.3)
    assert any((tmp_path / "tensorboard").iterdir())
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert lines[0].startswith("step 1: reward/mean=0.1")
