"""verl's `model.override_config`: config.json fields replaced wherever the model is built or planned."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.config_loader import load_config
from trainer.input_errors import InputError
from trainer.memory_plan.shape import read_shape
from trainer.preflight import check_lengths_fit_model
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.training.dist_utils import single_process_group


def test_verls_plus_spelling_adds_fields():
    cfg = load_config(["+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                       "+critic.model.override_config.rope_theta=20000.0"])
    assert dict(cfg.actor_rollout_ref.model.override_config) == {"attention_dropout": 0.1}
    assert dict(cfg.critic.model.override_config) == {"rope_theta": 20000.0}


def test_the_trainers_model_is_built_with_the_overrides(tiny_model_dir):
    config = actor_rollout_ref_config({"model": {"path": tiny_model_dir, "override_config": {"attention_dropout": 0.25}}})
    with single_process_group(torch.device("cpu")):
        engine = FSDPBackend(AutoModelForCausalLM, config["model"], 0)
        assert engine.module.config.attention_dropout == 0.25
        assert engine.config_overrides == {"attention_dropout": 0.25}  # what a hybrid engine is built with too


def test_the_plan_and_the_length_check_read_the_overrides(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    positions = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    longer = [f"actor_rollout_ref.model.path={folder}", "actor_rollout_ref.rollout.name=vllm",
              f"data.max_prompt_length={positions}", "data.max_response_length=8"]
    with pytest.raises(InputError, match="max_position_embeddings"):
        check_lengths_fit_model(load_config(longer))
    check_lengths_fit_model(load_config([*longer, f"+actor_rollout_ref.model.override_config.max_position_embeddings={positions + 8}"]))
    assert read_shape(str(folder), "k", {"num_hidden_layers": 1}).layers == 1
