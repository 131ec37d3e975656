"""Tokenizer, prompt loader, validation batches and rule reward of a run, built from the trainer config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from protocol import DataProto


@dataclass
class RunData:
    tokenizer: Any
    train_loader: Any  # endless, resumable (trainer.data.RLDataLoader)
    val_batches: list[DataProto]
    reward_fn: Any  # the reward manager: rollout -> ([B, R] token scores, metrics)
    prompt_counts: dict[str, int]  # prompts, and how many were filtered / truncated for length


def build_run_data(cfg: DictConfig) -> RunData:
    """Load the tokenizer of the (pre-checked) model folder, the datasets and the reward function."""
    from trainer.algorithm_settings import gen_batch_size
    from trainer.data import RLDataset, collate_to_dataproto, make_dataloader
    from trainer.data_counts import describe, prompt_counts
    from trainer.preflight import load_tokenizer
    from trainer.rewards.managers import build_reward_manager

    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    data = cfg.data
    vision = vision_tokens(cfg.actor_rollout_ref.model.path, tokenizer)
    filter_overlong = bool(data.get("filter_overlong_prompts", False))  # verl's key: drop, whatever truncation says

    def dataset(files: Any) -> RLDataset:
        return RLDataset(
            files, tokenizer, data.max_prompt_length, prompt_key=data.prompt_key, truncation=data.truncation,
            image_key=data.get("image_key"), vision=vision, filter_overlong_prompts=filter_overlong,
            return_raw_chat=bool(data.get("return_raw_chat", True)),
        )

    train_set = dataset(data.train_files)
    train_loader = make_dataloader(train_set, gen_batch_size(cfg), shuffle=data.shuffle, seed=data.seed, drop_last=True)
    counts = prompt_counts(train_set)
    print(describe(counts, data.max_prompt_length, data.truncation, filter_overlong))
    val_batches = []
    if data.val_files:
        val_set = dataset(data.val_files)  # filtered as the train files are (verl filters both)
        if val_set.num_filtered:
            print(f"data: {val_set.num_filtered} validation prompts longer than max_prompt_length="
                  f"{data.max_prompt_length} dropped ({len(val_set)} left)")
        items = [val_set[i] for i in range(len(val_set))]
        val_batches = [
            collate_to_dataproto(items[i : i + data.val_batch_size]) for i in range(0, len(items), data.val_batch_size)
        ]
    reward_fn = build_reward_manager(cfg, tokenizer)  # reward_model.reward_manager (trainer/rewards/managers.py)
    return RunData(tokenizer, train_loader, val_batches, reward_fn, counts)


def vision_tokens(model_path: str, tokenizer: Any) -> Any:
    """How the prompts write images for a vision-language model (trainer/data/images.py); None for a text model."""
    from trainer.data.images import VisionTokens
    from workers.vision.models import folder_is_vision_language

    return VisionTokens.from_model(model_path, tokenizer) if folder_is_vision_language(model_path) else None
