"""Batches of different steps or draws concatenate: their per-batch meta_info keys (sampling seed, rollout
weights version) are combined by rule, every other key must still agree."""

import pytest
import torch

from protocol import DataProto
from protocol.meta_merge import PER_BATCH_KEYS, ROLLOUT_WEIGHTS_VERSION, register_per_batch_key
from trainer.rollout_pipeline import prompts_for_step, sampling_seed


def _prompts(step: int, draw: int = 0) -> DataProto:
    return prompts_for_step(DataProto.from_dict({"x": torch.arange(3)}), step=step, n=2, seed=7, draw=draw)


def test_two_steps_and_two_draws_concatenate_with_unique_uids():
    parts = [_prompts(0), _prompts(1), _prompts(1, draw=1)]
    seeds = [p.meta_info["seed"] for p in parts]
    assert len(set(seeds)) == 3 and seeds[:2] == [7 * 100_003, 7 * 100_003 + 1]
    merged = DataProto.concat(parts)
    uids = merged.non_tensor_batch["uid"].tolist()
    assert len(merged) == 18 and len(set(uids)) == 9 and uids[:4] == ["0-0-0", "0-0-0", "0-0-1", "0-0-1"]
    assert merged.meta_info == {"seed": seeds[0]}  # the first item's seed


def test_seeds_of_draws_are_distinct_and_reproducible():
    seeds = {sampling_seed(0, step, draw) for step in range(50) for draw in range(5)}
    assert len(seeds) == 250 and sampling_seed(0, 3, 2) == sampling_seed(0, 3, 2)


def test_weights_versions_merge_to_the_oldest_and_other_keys_must_agree():
    a, b = _prompts(0), _prompts(1)
    a.meta_info[ROLLOUT_WEIGHTS_VERSION], b.meta_info[ROLLOUT_WEIGHTS_VERSION] = 4, 3
    assert DataProto.concat([a, b]).meta_info[ROLLOUT_WEIGHTS_VERSION] == 3
    a.meta_info["temperature"], b.meta_info["temperature"] = 1.0, 0.5
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] is 1.0 in item 0 but 0.5 in item 1.*register_per_batch_key"):
        DataProto.concat([a, b])


def test_a_key_of_your_own_can_be_registered():
    a, b = _prompts(0), _prompts(1)
    a.meta_info["draw_note"], b.meta_info["draw_note"] = "first", "second"
    try:
        register_per_batch_key("draw_note", list)
        assert DataProto.concat([a, b]).meta_info["draw_note"] == ["first", "second"]
    finally:
        PER_BATCH_KEYS.pop("draw_note")
    with pytest.raises(ValueError, match="always gathered"):
        register_per_batch_key("metrics", list)
