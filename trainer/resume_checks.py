"""What a checkpoint was trained with that a resumed run must match: the LoRA settings and the models' shapes.

Each save records them in the driver state (`resume_record`); before Ray starts, the run compares its own
with the checkpoint it would resume (`resume_mismatch`). A LoRA checkpoint holds only the adapter and a full
one holds every weight, so another rank, target list or model shape cannot load; without this check the
workers refuse it after Ray started, one traceback per rank. A checkpoint saved before the record existed
is resumed unchecked (its workers still refuse a mismatch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.memory_plan.shape import language_model_config
from workers.lora.spec import LoraSpec

RECORD_KEY = "trained_with"
MODEL = "actor_rollout_ref.model"
LORA_KEYS = ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")
# config.json fields that fix the shape of the weights (and of a LoRA adapter over them).
SHAPE_KEYS = (
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "tie_word_embeddings",
)


def model_shape(path: str) -> dict[str, Any]:
    """The shape fields of a model folder's config.json ({} when it cannot be read)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    # a VLM's sizes sit in text_config
    config = {**language_model_config(config), "model_type": config.get("model_type")}
    return {key: config[key] for key in SHAPE_KEYS if key in config}


def _model_paths(cfg: DictConfig) -> dict[str, str]:
    paths = {f"{MODEL}.path": cfg.actor_rollout_ref.model.path}
    if OmegaConf.select(cfg, "algorithm.adv_estimator") == "gae":
        paths["critic.model.path"] = cfg.critic.model.path
    return paths


def _lora_settings(cfg: DictConfig) -> dict[str, Any]:
    model = OmegaConf.to_container(cfg.actor_rollout_ref.model, resolve=True)
    return {key: model.get(key) for key in LORA_KEYS}


def resume_record(cfg: DictConfig) -> dict[str, Any]:
    """The record a checkpoint's driver state keeps under RECORD_KEY."""
    return {"lora": _lora_settings(cfg), "shapes": {key: model_shape(path) for key, path in _model_paths(cfg).items()}}


def _lora_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The LoRA keys whose values differ as the workers compare them (LoraSpec: normalised names, float alpha)."""
    saved_spec, now_spec = LoraSpec.from_model_config(saved), LoraSpec.from_model_config(now)
    if saved_spec is None or now_spec is None:
        return [] if saved_spec is now_spec else ["lora_rank"]
    fields = {"lora_rank": "rank", "lora_alpha": "alpha", "target_modules": "target_modules",
              "exclude_modules": "exclude_modules"}
    return [key for key, field in fields.items() if getattr(saved_spec, field) != getattr(now_spec, field)]


def _described(values: dict[str, Any], keys: list[str], prefix: str) -> str:
    return ", ".join(f"{prefix}{key}={values.get(key)!r}" for key in keys)


def resume_mismatch(cfg: DictConfig, path: Path, driver_state: dict[str, Any]) -> str | None:
    """Why the checkpoint at `path` cannot be resumed by this run's settings, or None."""
    record = driver_state.get(RECORD_KEY)
    if not isinstance(record, dict):
        return None  # saved before the record existed
    start_over = "or start over with trainer.resume_mode=disable or another trainer.default_local_dir"
    where = f"the checkpoint {path} (trainer.resume_mode={cfg.trainer.resume_mode})"
    saved_lora, now_lora = record.get("lora", {}), _lora_settings(cfg)
    differing = _lora_differences(saved_lora, now_lora)
    if differing:
        saved = _described(saved_lora, differing, f"{MODEL}.")
        return (
            f"{where} was trained with {saved}, but this run sets {_described(now_lora, differing, f'{MODEL}.')}; "
            f"set {saved} to resume it, {start_over}"
        )
    for key, path_now in _model_paths(cfg).items():
        saved_shape, now_shape = record.get("shapes", {}).get(key), model_shape(path_now)
        if not saved_shape or not now_shape:
            continue
        changed = [f for f in SHAPE_KEYS if f in saved_shape and f in now_shape and saved_shape[f] != now_shape[f]]
        if changed:
            saved, now = _described(saved_shape, changed, ""), _described(now_shape, changed, "")
            return (
                f"{where} was trained on a model with {saved}, but {key}={path_now!r} has {now}; point {key} at the "
                f"model the checkpoint was trained from, {start_over}"
            )
    return None
