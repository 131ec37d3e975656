"""Builders shared by the worker tests: configs, prompt batches, groups and driver-side references."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from protocol import DataProto
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.packing.test_packed_forward import rollout_batch

PAD, EOS = 0, 1
CALL_TIMEOUT_S = 180.0  # a hang in a collective fails the test instead of blocking the session


def deep_update(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_update(merged[key], value)
        else:
            merged[key] = value
    return merged


def actor_config(model_dir: str, **overrides: Any) -> dict[str, Any]:
    base = {
        "model": {"path": model_dir},
        "actor": {
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": 2,
        },
        "rollout": {"response_length": 8, "log_prob_micro_batch_size_per_gpu": 2},
        "ref": {"log_prob_micro_batch_size_per_gpu": 3},
    }
    return deep_update(base, overrides)


def make_group(pool: RayResourcePool, cls: type, *args: Any) -> RayWorkerGroup:
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls, *args), call_timeout_s=CALL_TIMEOUT_S)
    group.init_model()
    return group


def left_padded_prompts(token_lists: list[list[int]], meta_info: dict[str, Any] | None = None) -> DataProto:
    """Prompts left-padded to the longest, with position ids counting real tokens from 0."""
    width = max(len(t) for t in token_lists)
    input_ids = torch.full((len(token_lists), width), PAD, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, tokens in enumerate(token_lists):
        input_ids[row, width - len(tokens) :] = torch.tensor(tokens)
        attention_mask[row, width - len(tokens) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        meta_info=meta_info,
    )


def random_prompts(batch: int, lengths: list[int], seed: int = 0) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(3, 64, (lengths[i % len(lengths)],), generator=generator).tolist() for i in range(batch)]
    return left_padded_prompts(tokens)


def update_batch(prompt_lengths: list[int], response_lengths: list[int], seed: int = 7) -> DataProto:
    """Rollout rows of the given lengths with what an update reads: old and reference log-probs, advantages (one per
    row), values and returns, drawn from one seeded generator."""
    data = rollout_batch(prompt_lengths, response_lengths, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    shape = data.batch["responses"].shape
    data.batch["old_log_probs"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    data.batch["ref_log_prob"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    data.batch["advantages"] = torch.randn(len(data), 1, generator=generator).expand(shape).contiguous()
    data.batch["values"] = 0.1 * torch.randn(shape, generator=generator)
    data.batch["returns"] = torch.randn(shape, generator=generator)
    return data


def hf_response_log_probs(model: torch.nn.Module, data: DataProto, temperature: float = 1.0) -> torch.Tensor:
    """Reference log p(response) [B, R] computed directly with a plain HF model on the driver."""
    responses = data.batch["responses"]
    length = responses.shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=data.batch["input_ids"],
            attention_mask=data.batch["attention_mask"],
            position_ids=data.batch["position_ids"],
        ).logits
    logits = logits[:, -length - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def assert_resume_round_trip(group: RayWorkerGroup, data: DataProto, path: str) -> tuple[dict[str, float], dict[str, float]]:
    """Update, save to `path`, update, load, update again: the load restores the saved log-probs and the
    repeated update lands where the first did (equal only if the optimizer state, the LR step and the
    shuffle counter came back too). Returns rank 0's metrics of the update after the save and after the load."""
    group.update_actor(data)  # optimizer state and LR schedule are non-trivial at the save
    group.save_checkpoint(path)
    saved = group.compute_log_prob(data).batch["old_log_probs"]
    first = group.update_actor(data)
    after_first = group.compute_log_prob(data).batch["old_log_probs"]
    assert not torch.allclose(after_first, saved, atol=1e-4)
    group.load_checkpoint(path)
    torch.testing.assert_close(group.compute_log_prob(data).batch["old_log_probs"], saved, atol=1e-6, rtol=0)
    again = group.update_actor(data)
    assert again[0]["lr"] == first[0]["lr"]
    assert again[0]["pg_loss"] == pytest.approx(first[0]["pg_loss"], abs=1e-6)
    torch.testing.assert_close(group.compute_log_prob(data).batch["old_log_probs"], after_first, atol=1e-6, rtol=0)
    return first[0], again[0]
