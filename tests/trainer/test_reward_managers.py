"""reward_model.reward_manager (verl's layout): the registry, the dapo manager's overlong buffer (from
reward_model.overlong_buffer or verl's reward_kwargs), and the task score dynamic sampling compares."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from protocol import DataProto
from trainer.config_loader import ConfigError, load_config
from trainer.reward_settings import (
    REWARD_MANAGERS,
    OverlongBuffer,
    check_reward_settings,
    declared_reward_kwarg,
    overlong_buffer,
)
from trainer.rewards import RuleRewardManager
from trainer.rewards.dapo import DAPORewardManager
from trainer.rewards.managers import BUILDERS, build_reward_manager, task_scores
from trainer.tiny_model import build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _responses(tokenizer, texts: list[str], width: int = 12) -> DataProto:
    """char_class responses (digits:8), each ended by EOS, right-padded to `width`."""
    rows, masks = [], []
    for text in texts:
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:width]
        rows.append(ids + [tokenizer.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    return DataProto.from_dict(
        {"responses": torch.tensor(rows), "response_mask": torch.tensor(masks)},
        {"data_source": np.array(["synthetic/char_class"] * len(texts), dtype=object),
         "reward_model": [{"style": "rule", "ground_truth": "digits:8"} for _ in texts]},
    )


def test_every_registered_manager_is_built():
    assert set(BUILDERS) == set(REWARD_MANAGERS) == {"naive", "dapo"}
    expected = r"reward_model.reward_manager='batch' is not valid; choose one of \['naive', 'dapo'\]"
    with pytest.raises(ConfigError, match=expected):
        load_config(["reward_model.reward_manager=batch"])


def test_naive_is_the_rule_reward(tokenizer):
    manager = build_reward_manager(load_config([]), tokenizer)
    assert type(manager) is RuleRewardManager


def test_dapo_manager_applies_the_overlong_penalty(tokenizer):
    """algorithm=dapo: limit 12, buffer 3, so a response of 9 tokens is free and one of 12 loses 1."""
    manager = build_reward_manager(load_config(["algorithm=dapo"]), tokenizer)
    assert isinstance(manager, DAPORewardManager) and manager.overlong == OverlongBuffer(3, 1.0, 12, True)
    data = _responses(tokenizer, ["12345678", "12345678abc", "1234"])  # 9, 12 and 5 tokens with EOS
    scores, task, metrics = task_scores(manager, data)
    rule, _ = RuleRewardManager(tokenizer)(data)
    lengths = data.batch["response_mask"].sum(-1)
    penalty = torch.clamp(-(lengths.float() - 9) / 3, max=0.0)
    assert penalty.tolist() == [0.0, -1.0, 0.0]
    assert torch.allclose(scores.sum(-1), rule.sum(-1) + penalty)
    assert torch.allclose(task, rule.sum(-1))  # verl's acc: the score before the penalty
    assert metrics["overlong_penalty_mean"] == pytest.approx(-1 / 3)
    assert metrics["overlong_fraction"] == pytest.approx(1 / 3)
    assert torch.equal(manager(data)[0], scores)


def test_the_penalty_metrics_follow_log(tokenizer):
    manager = build_reward_manager(load_config(["algorithm=dapo", "reward_model.overlong_buffer.log=false"]), tokenizer)
    _, metrics = manager(_responses(tokenizer, ["12345678abc"]))
    assert not any(key.startswith("overlong") for key in metrics)


def test_dapo_without_the_buffer_scores_as_naive(tokenizer):
    cfg = load_config(["reward_model.reward_manager=dapo"])
    assert overlong_buffer(cfg) is None
    data = _responses(tokenizer, ["12345678abc", "12"])
    assert torch.equal(build_reward_manager(cfg, tokenizer)(data)[0], RuleRewardManager(tokenizer)(data)[0])


def _with_kwargs(overrides: list[str], kwargs: dict) -> OmegaConf:
    cfg = load_config(overrides)
    with open_dict(cfg):
        cfg.reward_model.reward_kwargs = kwargs
    return cfg


DAPO_SCRIPT_KWARGS = {
    "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 0.5, "log": False}, "max_resp_len": 10,
}


def test_verl_reward_kwargs_set_the_same_buffer():
    """verl's DAPO scripts: +reward_model.reward_kwargs.overlong_buffer_cfg.* and .max_resp_len (the limit)."""
    cfg = _with_kwargs(["reward_model.reward_manager=dapo"], DAPO_SCRIPT_KWARGS)
    assert check_reward_settings(cfg) == []
    assert overlong_buffer(cfg) == OverlongBuffer(length=4, penalty_factor=0.5, limit=10, log=False)
    assert declared_reward_kwarg("reward_model.reward_kwargs.overlong_buffer_cfg.len")
    assert not declared_reward_kwarg("reward_model.reward_kwargs.reward_fn_key")


@pytest.mark.parametrize(
    "overrides, kwargs, expected",
    [
        ([], DAPO_SCRIPT_KWARGS, "are arguments of reward_model.reward_manager=dapo, not 'naive'"),
        (["algorithm=dapo"], DAPO_SCRIPT_KWARGS, "set the same overlong buffer twice"),
        (["reward_model.reward_manager=dapo"], {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": True, "len": 10}},
         "reward_model.reward_kwargs.overlong_buffer_cfg.len=10 must be an integer in 1..9"),
        (["reward_model.reward_manager=dapo"], {"reward_fn_key": "data_source"}, "has unknown keys ['reward_fn_key']"),
    ],
)
def test_bad_reward_kwargs_are_named(overrides, kwargs, expected):
    problems = check_reward_settings(_with_kwargs(overrides, kwargs))
    assert len(problems) == 1 and expected in problems[0], problems


def test_the_dapo_script_reward_keys_load():
    """The reward lines of verl's gmpo_trainer/test_dapo_7b_math.sh, as written (needs the config loader to accept
    the `+reward_model.reward_kwargs.*` additions: trainer.reward_settings.declared_reward_kwarg)."""
    cfg = load_config([
        "data.max_response_length=16", "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False", "+reward_model.reward_kwargs.max_resp_len=16",
    ])
    assert overlong_buffer(cfg) == OverlongBuffer(length=4, penalty_factor=1.0, limit=16, log=False)
