"""docs/recipes.md's worked examples: the page holds examples/my_recipe/my_recipe.py and
recipes/custom_worker_example.py verbatim, and the worker example runs (the recipe runs in test_user_recipe.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from protocol import DataProto
from recipes import custom_worker_example
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import run_overrides

VERBATIM = ("examples/my_recipe/my_recipe.py", "recipes/custom_worker_example.py")


@pytest.mark.parametrize("source", VERBATIM)
def test_guide_shows_the_example_verbatim(source):
    page = (REPO_ROOT / "docs" / "recipes.md").read_text()
    marker = f"<!-- verbatim: {source} -->"
    block = re.search(re.escape(marker) + r"\n```python\n(.*?)```", page, re.S)
    assert block, f"docs/recipes.md lost the {marker} code block"
    assert block.group(1) == (REPO_ROOT / source).read_text()


def test_group_advantage_is_relative_to_the_prompt(tiny_assets):
    judge = custom_worker_example.GroupJudge(tiny_assets["model"])
    data = DataProto.from_dict(
        {"score": torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2]), "row": torch.arange(5)},
        {"uid": np.array(list("aabbc"), dtype=object)},
    )
    out = judge.group_advantage(data)
    assert out.batch["advantage"].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0])


@pytest.mark.slow
def test_guide_example_runs(ray_cluster, tiny_assets, tmp_path):
    history = custom_worker_example.run(run_overrides(tiny_assets, tmp_path), steps=3)
    assert len(history) == 3
    assert all(0.0 <= h["score"] <= 1.0 and np.isfinite(h["pg_loss"]) for h in history)
