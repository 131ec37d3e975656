"""Fixtures of the image tests: the tiny Qwen2-VL (trainer/tiny_vlm.py) and the visual_colors data on disk."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> str:
    from trainer.tiny_vlm import build_tiny_vlm

    return str(build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm")))


@pytest.fixture(scope="session")
def visual_data(tmp_path_factory) -> tuple[str, str]:
    from trainer.datasets.synthetic import write_synthetic_dataset

    train, val = write_synthetic_dataset(tmp_path_factory.mktemp("visual_colors"), 64, 16, tasks=("visual_colors",))
    return str(train), str(val)
