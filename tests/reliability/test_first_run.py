"""First-run friction: each bad input or surprising case gives one `error:` line (exit 2) or a clear note,
before Ray starts (init_ray is replaced by a function that fails the test if reached)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer import checkpointing
from trainer.config_loader import ConfigError, load_config
from trainer.main import main


def test_help_prints_the_usage(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m trainer.main [overrides...] [--cfg job]" in out
    assert "recipe=<name | path/to/my_recipe.py | path/to/folder>" in out and "docs/recipes.md" in out


def test_help_lists_the_config_groups_recipes_and_docs_from_their_files(capsys):
    """Every choice file of trainer.yaml's groups (with its first comment line), the built-in recipes and every
    docs page (with its title) are listed; the default choice is marked."""
    from trainer.cli_help import CONFIG_DIR, DOCS_DIR, WIDTH
    from trainer.recipe_runner import BUILT_IN_RECIPES

    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    for group in ("algorithm", "task"):
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            described = next(row for name, row in rows.items() if name == f"{group}={path.stem}")
            comments = [line for line in path.read_text().splitlines() if line.startswith("# ")]
            comment = next(line for line in comments if "@package" not in line)
            assert comment[2:30] in described, (described, comment)
    assert "algorithm=grpo (default)" in rows["algorithm=grpo"]
    assert next(line for line in lines if line.startswith("Recipes:")).count("recipe=") == len(BUILT_IN_RECIPES) + 1
    for page in DOCS_DIR.glob("*.md"):
        title = next(line[2:] for line in page.read_text().splitlines() if line.startswith("# "))
        assert rows[page.name].split(None, 1)[1] == title


def test_config_groups_come_from_the_defaults_list_and_the_folders(tmp_path):
    from trainer.cli_help import config_groups

    (tmp_path / "main.yaml").write_text("defaults:\n  - _self_\n  - color: red\n  - size: null\nkey: 1\n")
    for name in ("color/red.yaml", "color/blue.yaml", "size/big.yaml", "unlisted/x.yaml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("# @package _global_\n# one line\n")
    groups = config_groups(tmp_path, "main.yaml")
    assert {group: (default, [p.stem for p in paths]) for group, (default, paths) in groups.items()} == {
        "color": ("red", ["blue", "red"]), "size": (None, ["big"]),
    }


def test_missing_model_folder(no_ray, small_assets, tmp_path, capsys):
    assert main(short_run({**small_assets, "model": str(tmp_path / "nowhere")}, tmp_path)) == 2
    assert error_lines(capsys) == [f"error: actor_rollout_ref.model.path='{tmp_path / 'nowhere'}' is not a folder (a Hugging Face model folder is expected)"]


def test_missing_dataset_file(no_ray, small_assets, tmp_path, capsys):
    missing = tmp_path / "train.parquet"
    assert main(short_run({**small_assets, "train": str(missing)}, tmp_path)) == 2
    assert error_lines(capsys) == [f"error: data.train_files: no such file ['{missing}']"]


@pytest.mark.parametrize(("column", "names"), [("prompt", "(set data.prompt_key to the column holding the chat messages)"),
                                              ("reward_model", "(verl's layout needs it)")])
def test_missing_dataset_column_names_the_setting(no_ray, small_assets, tmp_path, capsys, column, names):
    train = tmp_path / "train.parquet"
    pq.write_table(pq.read_table(small_assets["train"]).drop_columns([column]), train)
    assert main(short_run({**small_assets, "train": str(train)}, tmp_path)) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"error: data.train_files: {train} has no column '{column}' {names}; columns present: [")


def test_prompt_key_naming_a_column_that_is_absent(no_ray, small_assets, tmp_path, capsys):
    assert main(short_run(small_assets, tmp_path, "data.prompt_key=question")) == 2
    assert "has no column 'question' (set data.prompt_key" in error_lines(capsys)[0]


@pytest.mark.parametrize(("override", "expected"), [
    ("actor_rollout_ref.rollout.temperature=hot", "error: config key 'actor_rollout_ref.rollout.temperature' must be a float > 0, got 'hot'"),
    ("critic.cliprange_value=wide", "error: config key 'critic.cliprange_value' must be a float >= 0, got 'wide'"),
])
def test_worker_setting_of_the_wrong_type_fails_on_the_driver(no_ray, small_assets, tmp_path, capsys, override, expected):
    assert main(short_run(small_assets, tmp_path, override)) == 2
    assert error_lines(capsys) == [expected]


def test_plus_addition_must_be_a_declared_key(capsys):
    assert main(["+trainer.total_trainig_steps=3", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown config key 'trainer.total_trainig_steps' (a '+' override adds a key, but nothing reads this one)" in err
    assert "did you mean 'trainer.total_training_steps'?" in err
    # A worker setting the YAML leaves at its default may be added.
    assert load_config(["+actor_rollout_ref.rollout.pad_token_id=5"]).actor_rollout_ref.rollout.pad_token_id == 5


def test_single_logger_name_is_accepted():
    assert list(load_config(["trainer.logger=console"]).trainer.logger) == ["console"]
    with pytest.raises(ConfigError, match=r"trainer.logger has unknown entries \['consol'\]"):
        load_config(["trainer.logger=consol"])


@pytest.mark.parametrize(("old", "new"), [("algorithm.rollout_n", "actor_rollout_ref.rollout.n"),
                                          ("algorithm.use_kl_loss", "actor_rollout_ref.actor.use_kl_loss")])
def test_old_names_of_a_setting_name_the_new_one(old, new):
    with pytest.raises(ConfigError, match=rf"'{old}' is now '{new}' \(one name per setting\); use {new}=4"):
        load_config([f"{old}=4"])


def test_algorithm_sets_the_defaults_under_their_one_name():
    assert load_config(["algorithm=ppo"]).actor_rollout_ref.rollout.n == 1
    grpo = load_config([])
    assert grpo.actor_rollout_ref.rollout.n == 8 and grpo.actor_rollout_ref.actor.use_kl_loss is True
    assert load_config(["algorithm=remax", "actor_rollout_ref.rollout.n=2"]).actor_rollout_ref.rollout.n == 2


@pytest.mark.parametrize("total", [2, 3])
def test_resume_at_or_past_the_last_step_says_so(no_ray, small_assets, tmp_path, capsys, total):
    checkpointing.save_checkpoint(tmp_path, 3, {"global_step": 3, "dataloader": {}}, lambda folder: None)
    assert main(short_run(small_assets, tmp_path, f"trainer.total_training_steps={total}")) == 0
    err = capsys.readouterr().err
    assert f"nothing to train: the checkpoint {tmp_path / 'global_step_3'} is at step 3 and trainer.total_training_steps={total}" in err
