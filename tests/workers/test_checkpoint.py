"""Sharded checkpoints of the actor (2 workers) and HF export."""

from __future__ import annotations

import os

import pytest
import torch

from tests.workers.helpers import (
    actor_config,
    assert_resume_round_trip,
    hf_response_log_probs,
    make_group,
    random_prompts,
)
from workers.fsdp import ActorRolloutRefWorker


@pytest.fixture(scope="module")
def actor_group(pool_2, tiny_model_dir):
    config = actor_config(tiny_model_dir, actor={"optim": {"lr": 1e-3, "lr_warmup_steps": 3}})
    group = make_group(pool_2, ActorRolloutRefWorker, config, "actor_rollout")
    yield group
    group.kill()


def _training_batch(group):
    data = group.generate_sequences(random_prompts(8, [3, 6], seed=7))
    data = data.union(group.compute_log_prob(data))
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(0))
    return data


def test_save_update_load_restores_model_optimizer_and_schedule(actor_group, tmp_path):
    _, again = assert_resume_round_trip(actor_group, _training_batch(actor_group), str(tmp_path / "ckpt"))
    assert again["lr"] < 1e-3  # still warming up
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["extra_state_rank0.pt", "extra_state_rank1.pt", "model_optim"]


def test_export_hf_reloads_with_same_log_probs(actor_group, tmp_path):
    from transformers import AutoModelForCausalLM

    data = _training_batch(actor_group)
    actor_group.update_actor(data)  # export the trained weights, not the initial ones
    actor_group.export_hf(str(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    expected = actor_group.compute_log_prob(data).batch["old_log_probs"]
    real = data.batch["response_mask"].bool()  # packed forwards score real response tokens only
    torch.testing.assert_close(hf_response_log_probs(exported, data)[real], expected[real], atol=1e-5, rtol=0)
    assert exported.config.architectures == ["Qwen2ForCausalLM"]
