"""Resuming a checkpoint with other LoRA settings or another model shape stops before Ray with one `error:`
line (exit code 2) naming both values, the checkpoint and what to do; a checkpoint saved before the record
existed still resumes."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer import checkpointing
from trainer.config_loader import load_config
from trainer.main import main, run
from trainer.preflight import check_resume_matches
from trainer.resume_checks import RECORD_KEY, model_shape, resume_record

LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]")
START_OVER = "or start over with trainer.resume_mode=disable or another trainer.default_local_dir"


def _saved_by(assets: dict[str, str], out, *overrides: str, record: bool = True) -> str:
    """A checkpoint folder of step 2 whose driver state is what a run with `overrides` saves."""
    state = {"global_step": 2, "dataloader": {}}
    if record:
        state[RECORD_KEY] = resume_record(load_config(short_run(assets, out, *overrides)))
    return str(checkpointing.save_checkpoint(out, 2, state, lambda folder: None))


@pytest.mark.parametrize(("saved", "now", "expected"), [
    (LORA, (*LORA, "actor_rollout_ref.model.lora_rank=16"),
     "was trained with actor_rollout_ref.model.lora_rank=8, but this run sets actor_rollout_ref.model.lora_rank=16; "
     "set actor_rollout_ref.model.lora_rank=8 to resume it"),
    (LORA, (*LORA, "actor_rollout_ref.model.lora_alpha=32"),
     "was trained with actor_rollout_ref.model.lora_alpha=16, but this run sets actor_rollout_ref.model.lora_alpha=32; "
     "set actor_rollout_ref.model.lora_alpha=16 to resume it"),
    (LORA, (*LORA, "actor_rollout_ref.model.target_modules=all-linear"),
     "was trained with actor_rollout_ref.model.target_modules=['q_proj', 'v_proj'], but this run sets "
     "actor_rollout_ref.model.target_modules='all-linear'; set actor_rollout_ref.model.target_modules=['q_proj', 'v_proj'] to resume it"),
    ((), LORA,
     "was trained with actor_rollout_ref.model.lora_rank=0, but this run sets actor_rollout_ref.model.lora_rank=8; "
     "set actor_rollout_ref.model.lora_rank=0 to resume it"),
], ids=["rank", "alpha", "targets", "full_then_lora"])
def test_other_lora_settings_stop_before_ray(no_ray, small_assets, tmp_path, capsys, saved, now, expected):
    path = _saved_by(small_assets, tmp_path, *saved)
    assert main(short_run(small_assets, tmp_path, "trainer.total_training_steps=3", *now)) == 2
    assert error_lines(capsys) == [f"error: the checkpoint {path} (trainer.resume_mode=auto) {expected}, {START_OVER}"]


def test_another_model_shape_stops_before_ray(no_ray, small_assets, tmp_path, capsys):
    path = _saved_by(small_assets, tmp_path / "ckpt")
    deeper = shutil.copytree(small_assets["model"], tmp_path / "deeper_model")
    config = json.loads((deeper / "config.json").read_text())
    layers = config["num_hidden_layers"]
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers + 1}))
    assets = {**small_assets, "model": str(deeper)}
    assert main(short_run(assets, tmp_path / "ckpt", "trainer.total_training_steps=3")) == 2
    assert error_lines(capsys) == [
        f"error: the checkpoint {path} (trainer.resume_mode=auto) was trained on a model with num_hidden_layers={layers}, "
        f"but actor_rollout_ref.model.path='{deeper}' has num_hidden_layers={layers + 1}; point actor_rollout_ref.model.path "
        f"at the model the checkpoint was trained from, {START_OVER}"
    ]


def test_a_vision_language_models_shape_is_its_language_models(tmp_path):
    # Qwen2-VL's config.json keeps the sizes in text_config: the record must hold them to tell two models apart.
    from transformers import Qwen2VLConfig

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=128)
    Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=64), tie_word_embeddings=True).save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    assert shape["model_type"] == "qwen2_vl" and shape["tie_word_embeddings"] is True
    assert {key: shape[key] for key in text} == text


def test_same_settings_and_old_checkpoints_pass(small_assets, tmp_path):
    _saved_by(small_assets, tmp_path / "same", *LORA)
    same = short_run(small_assets, tmp_path / "same", "trainer.total_training_steps=3", *LORA)
    check_resume_matches(load_config(same))
    _saved_by(small_assets, tmp_path / "old", *LORA, record=False)  # saved before the record existed: unchecked
    check_resume_matches(load_config(short_run(small_assets, tmp_path / "old", "actor_rollout_ref.model.lora_rank=4")))


@pytest.mark.slow
def test_a_real_lora_checkpoint_refuses_another_rank_before_ray(
    ray_cluster, small_assets, tmp_path, capsys, monkeypatch
):
    """The record is written by the training loop's own save."""
    small = ("trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.rollout.n=2", "trainer.logger=[console]")
    run(load_config(short_run(small_assets, tmp_path, *small, *LORA, "trainer.total_training_steps=1")))
    capsys.readouterr()

    def must_not_start(cfg):
        raise AssertionError("Ray was started for a resume that should have failed before it")

    monkeypatch.setattr("trainer.run_setup.init_ray", must_not_start)
    overrides = short_run(small_assets, tmp_path, *small, *LORA, "actor_rollout_ref.model.lora_rank=16")
    assert main(overrides) == 2
    assert error_lines(capsys) == [
        f"error: the checkpoint {tmp_path / 'global_step_1'} (trainer.resume_mode=auto) was trained with "
        "actor_rollout_ref.model.lora_rank=8, but this run sets actor_rollout_ref.model.lora_rank=16; set "
        f"actor_rollout_ref.model.lora_rank=8 to resume it, {START_OVER}"
    ]
