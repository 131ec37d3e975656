"""The recipe's config (unknown keys, bad DPO values), the `trainer.main recipe=` selector, pair packing
and the guide's custom dispatch functions: all without Ray."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from protocol import DataProto
from recipes.config import ConfigError, load_recipe_config
from recipes.custom_worker_example import concat_in_row_order, split_by_prompt
from recipes.pair_batch import pack_pairs, pad_for_ranks
from trainer.main import main as trainer_main
from trainer.recipe_runner import find_recipe
from workers.training.dpo_update import PAIR_KEYS, DPOSettings


def test_defaults_and_overrides():
    cfg = load_recipe_config("online_dpo", ["dpo.loss_type=ipo", "dpo.beta=0.5"])
    assert (cfg.dpo.loss_type, cfg.dpo.beta, cfg.dpo.label_smoothing) == ("ipo", 0.5, 0.0)
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.trainer.experiment_name == "tiny_online_dpo"


def test_unknown_dpo_key_lists_the_dpo_keys():
    with pytest.raises(ConfigError, match=r"unknown config key 'dpo.betta'[\s\S]*valid keys under dpo: \['beta', 'epochs'"):
        load_recipe_config("online_dpo", ["dpo.betta=0.1"])
    with pytest.raises(ConfigError, match="valid keys under trainer"):
        load_recipe_config("online_dpo", ["trainer.nope=1"])


@pytest.mark.parametrize(
    "override, match",
    [
        ("dpo.loss_type=kto", "choose one of"), ("dpo.beta=0", "beta"), ("dpo.epochs=0", "epochs"),
        ("dpo.label_smoothing=0.6", "label_smoothing"), ("dpo.normalize_by=tokens", "normalize_by"),
    ],
)
def test_bad_dpo_values(override, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe_config("online_dpo", [override])


def test_trainer_main_selects_the_recipe(capsys):
    assert trainer_main(["recipe=online_dpo", "dpo.beta=0.3", "--cfg", "job"]) == 0
    assert "beta: 0.3" in capsys.readouterr().out
    assert trainer_main(["recipe=nope"]) == 2
    assert "give a built-in name ['online_dpo', 'raft'], a .py file, or a folder" in capsys.readouterr().err
    assert trainer_main(["recipe=online_dpo", "dpo.nope=1"]) == 2
    assert find_recipe("online_dpo").__name__ == "recipes.online_dpo"
    assert trainer_main(["recipe=raft", "raft.min_reward=0.5", "--cfg", "job"]) == 0
    assert "raft:\n  min_reward: 0.5" in capsys.readouterr().out


def rollout(n: int) -> DataProto:
    ids = torch.arange(n * 6).reshape(n, 6)
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": ids % 6,
        "responses": ids[:, 3:], "response_mask": torch.ones(n, 3, dtype=torch.long),
    })


def test_pack_pairs_keeps_each_pair_in_one_row_and_pads_with_weight_zero():
    pairs = pack_pairs(rollout(5), np.array([1, 4, 2]), np.array([0, 3, 2]))
    assert set(pairs.batch.keys()) == set(PAIR_KEYS) - {"chosen_ref_logps", "rejected_ref_logps"}
    assert pairs.batch["chosen_input_ids"][:, 0].tolist() == [6, 24, 12]
    assert pairs.batch["rejected_responses"][:, 0].tolist() == [3, 21, 15]
    padded = pad_for_ranks(pairs, 2)
    assert padded.batch["weight"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert pairs.batch["weight"].tolist() == [1.0, 1.0, 1.0]  # the input is not modified
    assert len(pad_for_ranks(pairs, 3)) == 3
    with pytest.raises(ValueError):
        pack_pairs(rollout(2), np.array([], dtype=np.int64), np.array([], dtype=np.int64))


def test_guide_dispatch_keeps_prompt_groups_together_and_restores_row_order():
    data = rollout(7)
    data = data.union(DataProto.from_dict(non_tensors={"uid": np.array(list("aabbbcc"), dtype=object)}))
    (chunks,), kwargs = split_by_prompt(types.SimpleNamespace(world_size=2), data)
    assert kwargs == {} and [list(c.non_tensor_batch["uid"]) for c in chunks] == [list("aabbb"), list("cc")]
    merged = concat_in_row_order(None, [chunks[1], chunks[0]])  # any rank order comes back in row order
    assert torch.equal(merged.batch["input_ids"], data.batch["input_ids"])


def test_worker_dpo_settings_reject_unknown_and_bad_values():
    assert DPOSettings.from_meta(None) == DPOSettings()
    assert DPOSettings.from_meta({"beta": 0.5, "epochs": 2, "loss_denominator": 16}).loss_denominator == 16
    with pytest.raises(ValueError, match="unknown DPO settings"):
        DPOSettings.from_meta({"betta": 0.5})
    with pytest.raises(ValueError, match="epochs"):
        DPOSettings.from_meta({"epochs": 0})
    with pytest.raises(ValueError, match="loss_denominator"):
        DPOSettings.from_meta({"loss_denominator": 0})
