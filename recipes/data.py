"""Tokenizer, prompt loader, validation batches and rule reward of a run, built from the trainer config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from protocol import DataProto


@dataclass
class RunData:
    tokenizer: Any
    train_loader: Any  # endless, resumable (trainer.data.RLDataLoader)
    val_batches: list[DataProto]
    reward_fn: Any  # RuleRewardManager: rollout -> ([B, R] token scores, metrics)


def build_run_data(cfg: DictConfig) -> RunData:
    from transformers import AutoTokenizer

    from trainer.data import RLDataset, collate_to_dataproto, make_dataloader
    from trainer.rewards import RuleRewardManager, load_reward_function

    model_path = cfg.actor_rollout_ref.model.path
    if not Path(model_path).is_dir():
        raise FileNotFoundError(f"actor_rollout_ref.model.path={model_path!r} is not a folder (a Hugging Face model folder is expected)")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = cfg.data

    def dataset(files: Any) -> RLDataset:
        return RLDataset(files, tokenizer, data.max_prompt_length, prompt_key=data.prompt_key, truncation=data.truncation)

    train_loader = make_dataloader(dataset(data.train_files), data.train_batch_size, shuffle=data.shuffle, seed=data.seed, drop_last=True)
    val_batches = []
    if data.val_files:
        val_set = dataset(data.val_files)
        items = [val_set[i] for i in range(len(val_set))]
        val_batches = [collate_to_dataproto(items[i : i + data.val_batch_size]) for i in range(0, len(items), data.val_batch_size)]
    reward = cfg.reward.custom_function
    reward_fn = RuleRewardManager(tokenizer, compute_score=load_reward_function(reward.path, reward.name))
    return RunData(tokenizer, train_loader, val_batches, reward_fn)
