"""Pure helpers of the FSDP workers (no Ray, no process group)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from workers.fsdp.checkpoint import rng_state, set_rng_state
from workers.fsdp.optim import lr_factor_fn
from workers.rollout.sampling import forced_lengths, sampling_params
from workers.rollout.shaping import assemble_rollout, response_mask_from_eos
from workers.training.ppo_loop import loss_units


def _optim(**overrides):
    return {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant",
            "total_training_steps": None, "min_lr_ratio": 0.0, "num_cycles": 0.5,
            **overrides}


def test_response_mask_ends_at_first_eos():
    responses = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 5, 1, 0], [5, 9, 6, 9]])
    expected = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert response_mask_from_eos(responses, (1, 9)).tolist() == expected


def _rollout_params(ignore_eos: bool, response_length: int = 4):
    from workers.config import actor_rollout_ref_config

    rollout = actor_rollout_ref_config({"model": {"path": "/m"}, "rollout": {"response_length": response_length, "ignore_eos": ignore_eos}})["rollout"]
    return sampling_params(rollout, {}, (1,), 0)


def test_ignore_eos_keeps_every_generated_token():
    prompts = {"input_ids": torch.tensor([[0, 3], [4, 5]]), "attention_mask": torch.tensor([[0, 1], [1, 1]]),
               "position_ids": torch.tensor([[0, 0], [0, 1]])}
    generated = torch.tensor([[5, 1, 7, 1], [1, 6, 0, 0]])
    stopped = assemble_rollout(prompts, generated, _rollout_params(False))
    assert stopped["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert stopped["responses"].tolist() == [[5, 1, 0, 0], [1, 0, 0, 0]]
    ignored = assemble_rollout(prompts, generated, _rollout_params(True), lengths=torch.tensor([4, 2]))
    assert ignored["response_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert ignored["responses"].tolist() == generated.tolist()  # EOS tokens stay inside the response
    assert ignored["attention_mask"][:, 2:].tolist() == ignored["response_mask"].tolist()
    assert assemble_rollout(prompts, generated, _rollout_params(True))["response_mask"].sum().item() == 8


def test_ignore_eos_generation_config_has_no_stop_token():
    assert _rollout_params(False).generation_config().eos_token_id == [1]
    config = _rollout_params(True, response_length=16).generation_config()
    assert config.eos_token_id == [] and config.max_new_tokens == 16 and not config.min_new_tokens


def test_a_response_stopped_short_without_eos_ends_at_its_length():
    """A forced length (or any stop before the response budget) with no EOS: the padding after it is not
    part of the response."""
    mask = torch.ones(2, 3, dtype=torch.long)
    prompts = {"input_ids": torch.full((2, 3), 7), "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}
    generated = torch.tensor([[5, 6, 0, 0], [5, 1, 0, 0]])
    out = assemble_rollout(prompts, generated, _rollout_params(False), lengths=torch.tensor([2, 2]))
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]]
    assert assemble_rollout(prompts, generated, _rollout_params(False))["response_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    infos = np.array([{"forced_response_length": 3}, {"forced_response_length": 99}, {}, None], dtype=object)
    assert forced_lengths({"extra_info": infos}, 4, limit=8) == [3, 8, None, None]


def test_lr_schedules():
    constant = lr_factor_fn(_optim(lr_warmup_steps=4))
    assert [constant(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = lr_factor_fn(_optim(lr_warmup_steps=2, lr_scheduler_type="cosine", total_training_steps=12, min_lr_ratio=0.1))
    assert cosine(0) == 0.5 and cosine(2) == pytest.approx(1.0)
    assert cosine(7) == pytest.approx(0.55) and cosine(12) == pytest.approx(0.1) and cosine(50) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_training_steps"):
        lr_factor_fn(_optim(lr_scheduler_type="cosine"))


def test_loss_units_follow_aggregation_mode():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_units(mask, "token-mean") == 3.0
    assert loss_units(mask, "seq-mean-token-mean") == 2.0


def test_rng_state_round_trip_through_weights_only_load(tmp_path):
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]
