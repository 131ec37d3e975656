"""model.use_liger: where Liger's kernels cannot run, the run stops with what to change (the kernels themselves
are Triton kernels: the GPU suite's ppo_critic case trains with them on)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.config_loader import load_config
from trainer.role_groups import actor_worker_config
from workers.config import actor_rollout_ref_config, critic_config
from workers.liger_kernels import apply_liger_kernels


def tiny_model() -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return Qwen2ForCausalLM(config)


def test_a_cpu_model_is_refused_with_the_key_to_change():
    model = tiny_model()
    forward_before = model.model.norm.forward
    with pytest.raises(ValueError, match=r"^model.use_liger=true needs a CUDA GPU .*set it false on cpu"):
        apply_liger_kernels(model, torch.device("cpu"))
    assert model.model.norm.forward == forward_before  # nothing patched


def test_megatron_refuses_it_for_the_actor_and_the_critic():
    with pytest.raises(ValueError, match=r"^model.use_liger=true applies to strategy='fsdp' only"):
        actor_rollout_ref_config({"model": {"path": "/m", "use_liger": True}, "actor": {"strategy": "megatron"}})
    with pytest.raises(ValueError, match=r"^critic.model.use_liger=true applies to strategy='fsdp' only"):
        critic_config({"model": {"path": "/m", "use_liger": True}, "strategy": "megatron"}, "critic")
    assert actor_rollout_ref_config({"model": {"path": "/m", "use_liger": True}})["model"]["use_liger"] is True


def test_verls_key_reaches_the_actor_worker():
    config = actor_worker_config(load_config(["actor_rollout_ref.model.use_liger=true"]))
    assert actor_rollout_ref_config(config)["model"]["use_liger"] is True
