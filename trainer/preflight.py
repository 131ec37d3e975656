"""Checks run on the driver before any worker starts, so a bad path fails in seconds with one clear message
instead of minutes later inside a worker (or, worse, silently: transformers builds an empty tokenizer
from a model folder that has none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

# Any one of these makes a folder loadable by AutoTokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


class InputError(ValueError):
    """A configured path or file that cannot be used; the message names the config key."""


def check_model_folder(path: str, key: str = "actor_rollout_ref.model.path", tokenizer: bool = True) -> Path:
    """A local Hugging Face model folder with a config, weights and (when `tokenizer`) a tokenizer."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{key}={path!r} is not a folder (a Hugging Face model folder is expected)")
    if not (folder / "config.json").is_file():
        raise InputError(f"{key}={path!r} has no config.json; is it a Hugging Face model folder?")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise InputError(f"{key}={path!r} holds no weights (looked for {list(WEIGHT_PATTERNS)})")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"{key}={path!r} has no tokenizer (looked for any of {list(TOKENIZER_FILES)}); copy the tokenizer "
            "files of the base model into it"
        )
    return folder


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a checked model folder; it must have a chat template (prompts are chat messages)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"the tokenizer in {path!r} has no chat template, but the prompts are chat messages; add a "
            "chat_template.jinja (or chat_template in tokenizer_config.json) to the model folder"
        )
    return tokenizer


def check_data_files(files: Any, key: str) -> None:
    """Every configured parquet file exists (the dataset checks columns and rows when it loads them)."""
    listed = [files] if isinstance(files, (str, Path)) else list(files or [])
    if not listed:
        raise InputError(f"{key} is empty; give one parquet file or a list of them")
    missing = [str(f) for f in listed if not Path(f).is_file()]
    if missing:
        raise InputError(f"{key}: no such file {missing}")


def check_inputs(cfg: DictConfig) -> None:
    """Every driver-side check of `cfg`'s paths, before Ray starts."""
    from trainer.checkpointing import find_resume_dir

    check_model_folder(cfg.actor_rollout_ref.model.path)
    check_data_files(cfg.data.train_files, "data.train_files")
    if cfg.data.val_files:
        check_data_files(cfg.data.val_files, "data.val_files")
    if cfg.reward.reward_model.enable and cfg.reward.reward_model.model.path:
        check_model_folder(cfg.reward.reward_model.model.path, "reward.reward_model.model.path", tokenizer=False)
    # Raises CheckpointError for a bad explicit path, or for `auto` when every step folder is damaged.
    find_resume_dir(cfg.trainer.default_local_dir, str(cfg.trainer.resume_mode), warn=False)
