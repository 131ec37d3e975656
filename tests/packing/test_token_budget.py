"""Token-budget grouping: every micro-batch fits the budget, groups are balanced, shards have equal rows."""

from __future__ import annotations

import random

import pytest

from workers.packing.token_budget import equal_size_shards, groups_needed, spread


def _sums(lengths, groups):
    return [sum(lengths[r] for r in g) for g in groups]


def test_groups_fit_the_budget_and_cover_every_row_once():
    rng = random.Random(0)
    lengths = [rng.randint(5, 120) for _ in range(37)]
    groups = spread(lengths, groups_needed(lengths, 200))
    assert sorted(r for g in groups for r in g) == list(range(37))
    assert max(_sums(lengths, groups)) <= 200
    assert len(groups) >= -(-sum(lengths) // 200)
    assert all(g == sorted(g) and g for g in groups)


def test_groups_needed_respects_a_floor_and_the_row_count():
    assert groups_needed([10, 10, 10, 10], 100) == 1
    assert groups_needed([10, 10, 10, 10], 100, at_least=3) == 3
    assert groups_needed([50, 50, 50], 50) == 3


def test_spread_balances_tokens():
    lengths = [100, 90, 10, 10, 5, 5, 80]
    assert sorted(_sums(lengths, spread(lengths, 3))) == [100, 100, 100]


def test_a_sequence_longer_than_the_budget_names_the_setting():
    with pytest.raises(ValueError, match=r"ppo_max_token_len_per_gpu=64 is smaller than the longest sequence \(65"):
        groups_needed([10, 65], 64, setting="ppo_max_token_len_per_gpu")


def test_equal_size_shards_have_equal_rows_and_balanced_tokens():
    rng = random.Random(1)
    lengths = sorted(rng.randint(1, 400) for _ in range(32))  # sorted: a plain split would be badly skewed
    shards = equal_size_shards(lengths, 4)
    assert [len(s) for s in shards] == [8] * 4
    sums = _sums(lengths, shards)
    naive = _sums(lengths, [list(range(i * 8, i * 8 + 8)) for i in range(4)])
    assert max(sums) - min(sums) <= max(lengths)
    assert max(sums) - min(sums) < (max(naive) - min(naive)) / 4
    with pytest.raises(ValueError, match="equal shards"):
        equal_size_shards(lengths, 5)


def test_balance_batch_regroups_rows_for_the_ranks():
    import numpy as np
    import torch

    from protocol import DataProto
    from trainer.balance import balance_batch

    lengths = torch.tensor([30, 28, 25, 20, 5, 4, 3, 1])  # sorted: rank 0 would get 103 tokens, rank 1 13
    mask = (torch.arange(32)[None] < lengths[:, None]).long()
    batch = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(8)}, non_tensors={"uid": np.array(list("abcdefgh"), dtype=object)})
    balanced = balance_batch(batch, 2)
    per_rank = [int(chunk.batch["attention_mask"].sum()) for chunk in balanced.chunk(2)]
    assert abs(per_rank[0] - per_rank[1]) <= 5
    rows = balanced.batch["row"].tolist()
    assert sorted(rows) == list(range(8))
    assert list(balanced.non_tensor_batch["uid"]) == [("abcdefgh")[r] for r in rows]  # rows stay whole
    assert balance_batch(batch, 3) is batch  # 8 rows do not split evenly over 3 ranks
