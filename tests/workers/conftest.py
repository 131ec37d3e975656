"""Fixtures of the worker tests: a tiny random Qwen2 causal LM on disk and CPU resource pools."""

from __future__ import annotations

import json

import pytest

from single_controller.ray import RayResourcePool

TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=128,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A random tiny causal LM saved with save_pretrained, plus a stand-in tokenizer file."""
    from tests.model_folders import write_random_qwen2

    path = tmp_path_factory.mktemp("tiny_qwen2")
    write_random_qwen2(path, TINY_CONFIG)
    # Not a usable tokenizer: only here to check that export_hf copies tokenizer files along.
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    return str(path)


@pytest.fixture(scope="module")
def pool_2(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    yield pool
    pool.release()


@pytest.fixture(scope="module")
def pool_1(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False)
    yield pool
    pool.release()
