"""Fixtures the memory-plan tests share."""

import json

import pytest

from tests.trainer.memory_plan_cases import QWEN_3B, QWEN_7B


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Model folders holding only a config.json (the Qwen2.5-7B and -3B shapes): all the plan reads."""
    root = tmp_path_factory.mktemp("memory_plan_models")
    paths = {}
    for name, config in (("7B", QWEN_7B), ("3B", QWEN_3B)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        paths[name] = str(root / name)
    return paths
