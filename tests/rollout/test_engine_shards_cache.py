"""The per-rank shards' vLLM compile cache lies apart from other engines' (workers/rollout/engine_shards.py)."""

import os
from pathlib import Path

import pytest

from workers.rollout import engine_shards


def test_shards_compile_into_a_folder_of_their_own_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    engine_shards._compile_cache_apart()
    apart = tmp_path / engine_shards.SHARD_COMPILE_CACHE
    assert os.environ["VLLM_CACHE_ROOT"] == str(apart)
    engine_shards._compile_cache_apart()  # a later shard in the same process: the same folder, not one below
    assert os.environ["VLLM_CACHE_ROOT"] == str(apart)
