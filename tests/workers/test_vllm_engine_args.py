"""verl's vLLM engine keys (rollout.enable_chunked_prefill, max_num_batched_tokens, max_num_seqs) reach the
engine's arguments, and rollout.top_k (-1 = off, as verl) reaches both engines' sampling; nothing starts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.config_loader import load_config
from trainer.role_groups import actor_worker_config
from workers.config import actor_rollout_ref_config
from workers.rollout.sampling import sampling_params
from workers.rollout.vllm_options import scheduler_options

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
R = "actor_rollout_ref.rollout."


def _rollout(*overrides: str) -> dict:
    cfg = load_config([R + "name=vllm", *overrides])
    return actor_rollout_ref_config(actor_worker_config(cfg), "actor_rollout_ref")["rollout"]


def test_the_keys_reach_the_engine_arguments():
    rollout = _rollout(
        R + "enable_chunked_prefill=True", R + "max_num_batched_tokens=4096",
        R + "max_num_seqs=64",
    )
    expected = {"enable_chunked_prefill": True, "max_num_batched_tokens": 4096, "max_num_seqs": 64}
    assert scheduler_options(rollout, CUDA) == expected
    off = _rollout(R + "enable_chunked_prefill=false", R + "max_num_batched_tokens=72")
    assert scheduler_options(off, CUDA) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 72}


def test_the_names_are_vllm_engine_arguments():
    engine_args = pytest.importorskip("vllm.engine.arg_utils").EngineArgs
    names = {field.name for field in dataclasses.fields(engine_args)}
    rollout = _rollout(R + "enable_chunked_prefill=true", R + "max_num_batched_tokens=96",
                       R + "max_num_seqs=8")
    assert set(scheduler_options(rollout, CUDA)) <= names


def test_null_leaves_vllms_defaults_and_cpu_prefills_whole_prompts():
    assert scheduler_options(_rollout(), CUDA) == {}
    chunked = _rollout(R + "enable_chunked_prefill=true", R + "max_num_batched_tokens=4096")
    assert scheduler_options(chunked, CPU) == {"max_num_batched_tokens": 4096}  # device_options: chunking off there


def test_too_few_batched_tokens_without_chunking_are_named():
    rollout = _rollout(R + "max_num_batched_tokens=16")  # max_model_len: 64 + 8
    with pytest.raises(ValueError, match=r"rollout.max_num_batched_tokens=16 is below max_model_len=72"):
        scheduler_options(rollout, CPU)
    assert scheduler_options(rollout, CUDA) == {"max_num_batched_tokens": 16}  # chunked prefill (vLLM's default) fits


@pytest.mark.parametrize(("top_k", "expected"), [(-1, 0), (0, 0), (5, 5)])
def test_top_k_reaches_hf_and_vllm_sampling(top_k, expected):
    rollout = _rollout(f"{R}top_k={top_k}")
    params = sampling_params(rollout, {}, (1,), 0)
    assert params.top_k == expected
    assert params.generation_config().top_k == expected  # HF generate: 0 is off
    vllm_sampling = pytest.importorskip("workers.rollout.vllm_engine").vllm_sampling
    pytest.importorskip("vllm")
    assert vllm_sampling(params, max_tokens=4, seed=0).top_k == expected


def test_bad_top_k_is_named():
    with pytest.raises(ValueError, match=r"config key 'actor_rollout_ref.rollout.top_k' must be an int: -1 or 0 \(off"):
        _rollout(R + "top_k=-2")
