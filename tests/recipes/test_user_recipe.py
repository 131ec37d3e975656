"""A recipe outside the package (examples/my_recipe, copied out of the repository): its declared config is
composed and checked like the built-in ones, and it runs both as `python my_recipe.py` (a fresh process,
without RAY_AUTH_MODE set by hand) and as `python -m trainer.main recipe=<folder>`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import ONE_RANK, run_overrides
from trainer.main import main as trainer_main

SHORT = (
    "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
    "trainer.save_at_end=false", ONE_RANK,
)


@pytest.fixture(scope="module")
def recipe_copy(tmp_path_factory):
    """examples/my_recipe copied to a folder outside the repository tree (one copy: this process imports
    the recipe under its own name, `my_recipe`, once)."""
    folder = shutil.copytree(REPO_ROOT / "examples" / "my_recipe", tmp_path_factory.mktemp("user") / "my_recipe")
    assert REPO_ROOT not in folder.resolve().parents
    return folder


def _python(args: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    child = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    child.update(PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", **env)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=child, capture_output=True, text=True, timeout=300)


def test_declared_config_is_merged_and_checked(recipe_copy, capsys):
    shown = _python(["my_recipe.py", "group_filter.scale_by_std=true", "--cfg", "job"], recipe_copy)
    assert shown.returncode == 0, shown.stderr
    assert "group_filter:\n  min_spread: 0.0\n  scale_by_std: true" in shown.stdout  # the typed section
    assert "experiment_name: my_recipe" in shown.stdout and "    'n': 4" in shown.stdout  # the yaml's values

    assert trainer_main([f"recipe={recipe_copy}", "group_filter.min_sprad=1"]) == 2
    assert "unknown config key 'group_filter.min_sprad'" in capsys.readouterr().err
    assert trainer_main([f"recipe={recipe_copy / 'my_recipe.py'}", "group_filter.scale_by_std=maybe"]) == 2
    assert "group_filter.scale_by_std=maybe" in capsys.readouterr().err
    assert trainer_main([f"recipe={recipe_copy}", "+group_filter.typo=1"]) == 2
    assert "valid keys under group_filter: ['min_spread', 'scale_by_std']" in capsys.readouterr().err
    assert trainer_main([f"recipe={recipe_copy.parent}"]) == 2
    assert "folder holding <folder name>.py" in capsys.readouterr().err


@pytest.mark.slow
def test_recipe_file_runs_as_a_script_outside_the_repo(recipe_copy, tiny_assets, tmp_path):
    out = tmp_path / "run"
    done = _python(["my_recipe.py", *run_overrides(tiny_assets, out, *SHORT)], recipe_copy)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("actor/pg_loss" in r and 0 < r["filter/kept_prompts"] <= 16 for r in records), records


@pytest.mark.slow
def test_recipe_folder_runs_through_trainer_main(ray_cluster, recipe_copy, tiny_assets, tmp_path):
    out = tmp_path / "run"
    assert trainer_main([f"recipe={recipe_copy}", *run_overrides(tiny_assets, out, *SHORT, "group_filter.scale_by_std=true")]) == 0
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all("actor/pg_loss" in r for r in records)
