"""docs/recipes.md's worked example: the page holds recipes/custom_worker_example.py verbatim, and it runs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from protocol import DataProto
from recipes import custom_worker_example
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import run_overrides

MARKER = "<!-- verbatim: recipes/custom_worker_example.py -->"


def test_guide_shows_the_example_verbatim():
    page = (REPO_ROOT / "docs" / "recipes.md").read_text()
    block = re.search(re.escape(MARKER) + r"\n```python\n(.*?)```", page, re.S)
    assert block, f"docs/recipes.md lost the {MARKER} code block"
    assert block.group(1) == (REPO_ROOT / "recipes" / "custom_worker_example.py").read_text()


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
