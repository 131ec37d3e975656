"""Data rows, the reward function and `trainer.logger` are checked before Ray starts: a plain-string prompt,
an unknown data_source, a missing ground truth, a bad reward file, an unknown or unusable tracker each give
one `error:` line naming the file and row (or the key) and the fix, with exit code 2."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import main
from trainer.preflight import check_inputs
from trainer.rewards import SCORERS


@pytest.fixture(scope="module")
def rows(small_assets) -> list[dict]:
    return pq.read_table(small_assets["train"]).to_pylist()


def write(rows: list[dict], path, schema: pa.Schema | None = None) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def fails_before_ray(capsys, assets, tmp_path, *overrides) -> str:
    assert main(short_run(assets, tmp_path / "run", *overrides)) == 2
    (line,) = error_lines(capsys)
    return line


def test_prompt_as_a_plain_string(no_ray, small_assets, rows, tmp_path, capsys):
    train = write([{**r, "prompt": r["prompt"][0]["content"]} for r in rows], tmp_path / "strings.parquet")
    text = rows[0]["prompt"][0]["content"]
    assert fails_before_ray(capsys, {**small_assets, "train": train}, tmp_path) == (
        f"error: data.train_files: {train} row 0: column 'prompt' holds a plain string ({text!r}), not chat messages; "
        f'store each prompt as a list of {{role, content}} messages, e.g. [{{"role": "user", "content": "{text}"}}]'
    )


@pytest.mark.parametrize(("row", "value", "expected"), [
    (5, None, "column 'prompt' is empty (null); every row needs its chat messages"),
    (3, [], "column 'prompt' holds no messages ([]); every row needs its chat messages"),
    (7, [{"role": None, "content": "hi"}], "a message of column 'prompt' has no role; each message is {role, content}"),
])
def test_bad_prompt_row_is_named(no_ray, small_assets, rows, tmp_path, capsys, row, value, expected):
    bad = [dict(r) for r in rows]
    bad[row]["prompt"] = value
    val = write(bad, tmp_path / "val.parquet")
    line = fails_before_ray(capsys, small_assets, tmp_path, f"data.val_files={val}")
    assert line == f"error: data.val_files: {val} row {row}: {expected}"


def test_unknown_data_source_without_a_reward_function(no_ray, small_assets, rows, tmp_path, capsys):
    bad = [dict(r) for r in rows]
    bad[9]["data_source"] = "my/task"
    train = write(bad, tmp_path / "train.parquet")
    line = fails_before_ray(capsys, {**small_assets, "train": train}, tmp_path)
    assert line == (
        f"error: data.train_files: {train} row 9: data_source 'my/task' has no built-in scorer (known: {sorted(SCORERS)}); "
        "set custom_reward_function.path to a .py file whose compute_score(data_source, solution_str, ground_truth, "
        "extra_info) scores it"
    )
    # A reward model adds its score to the rule score, which still needs a scorer for every row.
    line = fails_before_ray(capsys, {**small_assets, "train": train}, tmp_path, "reward_model.enable=true",
                            f"reward_model.model.path={small_assets['model']}")
    assert line.endswith("scores it (the reward model's score is added to the rule score; a compute_score returning 0.0 "
                         "uses the model alone)")


def test_a_reward_function_of_your_own_scores_any_data_source(small_assets, rows, tmp_path):
    bad = [{**r, "data_source": "my/task", "reward_model": {"style": "rule", "ground_truth": None}} for r in rows]
    train = write(bad, tmp_path / "train.parquet")
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    assert check_inputs(load_config(short_run({**small_assets, "train": train}, tmp_path / "run",
                                              f"custom_reward_function.path={reward}"))) is None


@pytest.mark.parametrize(("source", "expected"), [
    ("missing.py", "reward function file '{dir}/missing.py' does not exist"),
    ("my_reward.py", "reward function 'compute_score' not found in '{dir}/my_reward.py'; callables there: ['score'] "
                     "(set custom_reward_function.name)"),
    ("broken.py", "loading it failed: ZeroDivisionError: division by zero"),
])
def test_reward_function_that_cannot_load(no_ray, small_assets, tmp_path, capsys, source, expected):
    (tmp_path / "my_reward.py").write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    (tmp_path / "broken.py").write_text("1 / 0\n")
    line = fails_before_ray(capsys, small_assets, tmp_path, f"custom_reward_function.path={tmp_path / source}")
    assert line.startswith(f"error: custom_reward_function.path='{tmp_path / source}': ")
    assert expected.format(dir=tmp_path) in line


def test_ground_truth_the_scorers_read(no_ray, small_assets, rows, tmp_path, capsys):
    no_field = write([{**r, "reward_model": {"style": "rule"}} for r in rows], tmp_path / "no_field.parquet")
    line = fails_before_ray(capsys, {**small_assets, "train": no_field}, tmp_path)
    assert line == (f"error: data.train_files: {no_field} row 0: column 'reward_model' has no 'ground_truth' field "
                    "(fields: ['style']); the reward reads reward_model['ground_truth']: store each row's answer there")
    missing = [dict(r) for r in rows]
    missing[4]["reward_model"] = {"style": "rule", "ground_truth": None}
    empty = write(missing, tmp_path / "empty.parquet")
    assert fails_before_ray(capsys, {**small_assets, "train": empty}, tmp_path) == (
        f"error: data.train_files: {empty} row 4: reward_model['ground_truth'] is empty (null); the built-in scorers "
        "compare the response with it"
    )
    as_text = write([{**r, "reward_model": "digits:3"} for r in rows], tmp_path / "text.parquet")
    assert "row 0: column 'reward_model' holds string, not a dict" in fails_before_ray(capsys, {**small_assets, "train": as_text}, tmp_path)


def test_rows_an_environment_scores_need_no_scorer(small_assets, tmp_path):
    train, val = write_synthetic_dataset(tmp_path / "vault", train_size=16, val_size=4, seed=0, tasks=("tool_vault",))
    assets = {**small_assets, "train": str(train)}
    assert check_inputs(load_config([*short_run(assets, tmp_path / "run"), "task=tool_vault", f"data.val_files={val}"])) is None


# ---- trainer.logger ------------------------------------------------------------------------------------


def test_tracker_package_not_installed(no_ray, small_assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb looks like to import
    assert fails_before_ray(capsys, small_assets, tmp_path, "trainer.logger=[console,wandb]") == (
        "error: trainer.logger entry 'wandb' needs the package(s) ['wandb'], which are not installed: "
        'pip install -e ".[tracking]"'
    )


def test_unknown_and_verl_tracker_names(small_assets, tmp_path, capsys):
    assert main(short_run(small_assets, tmp_path, "trainer.logger=[console,swanlab]")) == 2
    assert "trainer.logger has unknown entries ['swanlab']; valid are ['console', 'jsonl', 'tensorboard', 'wandb', " \
           "'mlflow'] or 'path/to/file.py:ClassName'" in capsys.readouterr().err
    assert main(short_run(small_assets, tmp_path, "trainer.logger=[console,file]")) == 2
    assert "trainer.logger entry 'file' is verl's name; here it is 'jsonl'" in capsys.readouterr().err
    assert main(short_run(small_assets, tmp_path, "trainer.logger=[jsonl,console,jsonl]")) == 2
    assert "trainer.logger lists ['jsonl'] more than once; each backend once" in capsys.readouterr().err


def test_tracker_class_that_cannot_load(no_ray, small_assets, tmp_path, capsys):
    (tmp_path / "tracker.py").write_text("class Tracker:\n    def __init__(self, **run):\n        pass\n")
    line = fails_before_ray(capsys, small_assets, tmp_path, f"trainer.logger=[console,{tmp_path}/tracker.py:Tracker]")
    assert line == (f"error: trainer.logger entry '{tmp_path}/tracker.py:Tracker': class Tracker has no log(metrics, step) "
                    "method; a tracker needs log(metrics, step) and may define finish()")


def test_wandb_without_an_account_fails_before_ray(no_ray, small_assets, tmp_path, capsys, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    line = fails_before_ray(capsys, small_assets, tmp_path, "trainer.logger=[console,wandb]")
    assert line.startswith("error: trainer.logger entry 'wandb' could not start: UsageError: ")
    assert line.endswith("(WANDB_MODE=offline logs without an account or network)")
