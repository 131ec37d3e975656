"""Fixtures of the packing tests that run an FSDP engine in this process: a tiny random Qwen2 folder and a one-rank
process group."""

from __future__ import annotations

import pytest
import torch

from tests.model_folders import write_random_qwen2
from tests.packing.test_packed_forward import CONFIG
from workers.training.dist_utils import single_process_group


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_random_qwen2(tmp_path_factory.mktemp("tiny_packing"), CONFIG)


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(torch.device("cpu")):
        yield
