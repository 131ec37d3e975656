"""Sharded checkpoints of the actor (2 workers) and HF export."""

from __future__ import annotations

import os

import pytest
import torch

from tests.workers.helpers import actor_config, hf_response_log_probs, make_group, random_prompts
from workers.fsdp import ActorRolloutRefWorker


@pytest.fixture(scope="module")
def actor_group(pool_2, tiny_model_dir):
    config = actor_config(tiny_model_dir, actor={"optim": {"lr": 1e-3, "warmup_steps": 3}})
    group = make_group(pool_2, ActorRolloutRefWorker, config, "actor_rollout")
    yield group
    group.kill()


def _training_batch(group):
    data = group.generate_sequences(random_prompts(8, [3, 6], seed=7))
    data = data.union(group.compute_log_prob(data))
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(0))
    return data


def test_save_update_load_restores_model_optimizer_and_schedule(actor_group, tmp_path):
    data = _training_batch(actor_group)
    actor_group.update_actor(data)  # optimizer state and LR schedule are non-trivial at the save
    actor_group.save_checkpoint(str(tmp_path / "ckpt"))
    saved = actor_group.compute_log_prob(data).batch["old_log_probs"]

    first = actor_group.update_actor(data)
    after_first = actor_group.compute_log_prob(data).batch["old_log_probs"]
    assert not torch.allclose(after_first, saved, atol=1e-4)

    actor_group.load_checkpoint(str(tmp_path / "ckpt"))
    torch.testing.assert_close(actor_group.compute_log_prob(data).batch["old_log_probs"], saved, atol=1e-6, rtol=0)
    # Same update again: equal only if Adam moments, the LR step and the shuffle counter came back too.
    again = actor_group.update_actor(data)
    assert again[0]["lr"] == first[0]["lr"] and again[0]["lr"] < 1e-3  # still warming up
    assert again[0]["pg_loss"] == pytest.approx(first[0]["pg_loss"], abs=1e-6)
    torch.testing.assert_close(actor_group.compute_log_prob(data).batch["old_log_probs"], after_first, atol=1e-6, rtol=0)
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
