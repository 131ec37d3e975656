import copy

import numpy as np
import pytest
import torch

from protocol.data_proto import DataProto
from protocol.testing import assert_dataproto_equal, shares_memory


def uids(data: DataProto) -> list[str]:
    return list(data.non_tensor_batch["uid"])


# ---------------------------------------------------------------- concat / chunk / split


def test_concat_of_chunks_equals_original(sample):
    parts = sample.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert shares_memory(parts[0], sample)  # chunks are views, like torch.chunk
    joined = DataProto.concat(parts)
    assert_dataproto_equal(joined, sample)
    assert not shares_memory(joined, sample)


def test_concat_merges_meta_info_and_checks_keys(sample):
    a, b = sample[:2], sample[2:]
    assert DataProto.concat([a, b]).meta_info == sample.meta_info
    b.meta_info["step"] = 99
    with pytest.raises(ValueError, match=r"meta_info\['step'\] is 3 in item 0 but 99 in item 1"):
        DataProto.concat([a, b])
    b.meta_info["step"] = 3
    c = sample[2:].select(batch_keys=["values"])
    with pytest.raises(ValueError, match=r"item 0 has batch keys \[.*'input_ids'.*\] but item 1 has \['values'\]"):
        DataProto.concat([a, c])
    d = sample[2:].select(non_tensor_batch_keys=["uid"])
    with pytest.raises(ValueError, match=r"item 0 has non_tensor_batch keys .* but item 1 has \['uid'\]"):
        DataProto.concat([a, d])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_chunk_requires_divisible_length(sample):
    with pytest.raises(ValueError, match=r"length 6 into 4 .*pad_to_divisor.*split"):
        sample.chunk(4)
    with pytest.raises(ValueError, match="positive"):
        sample.chunk(0)


def test_split_last_part_may_be_smaller(sample):
    parts = sample.split(4)
    assert [len(p) for p in parts] == [4, 2]
    assert_dataproto_equal(DataProto.concat(parts), sample)
    assert sample[:0].split(3) == []


# ---------------------------------------------------------------- repeat / reorder / to


def test_repeat_interleave_and_tile(sample_factory):
    data = sample_factory(3)
    before = copy.deepcopy(data)
    assert uids(data.repeat(2, interleave=True)) == ["uid-0", "uid-0", "uid-1", "uid-1", "uid-2", "uid-2"]
    tiled = data.repeat(2, interleave=False)
    assert uids(tiled) == ["uid-0", "uid-1", "uid-2"] * 2
    assert torch.equal(tiled.batch["extra", "logp"], data.batch["extra", "logp"].repeat(2, 1))
    assert len(data.repeat(0)) == 0
    assert not shares_memory(tiled, data)
    assert_dataproto_equal(data, before)


def test_reorder_changes_self_like_verl_and_leaves_shared_tensors_alone(sample):
    before = copy.deepcopy(sample)
    view = sample[0:6]  # shares the tensors of `sample`
    order = [5, 3, 1, 0, 2, 4]
    returned = sample.reorder(torch.tensor(order))
    assert returned is sample  # verl reorders in place; returning self also allows `data = data.reorder(idx)`
    assert uids(sample) == [f"uid-{i}" for i in order]
    assert torch.equal(sample.batch["values"], before.batch["values"][order])
    assert not shares_memory(sample, view)
    assert_dataproto_equal(view, before)  # the rows other DataProtos hold are not rewritten
    assert uids(before.reorder(np.array(order))) == uids(sample)


def test_reorder_takes_any_index_like_batch_indexing(sample):
    assert uids(sample.reorder([0, 0, 1])) == ["uid-0", "uid-0", "uid-1"]  # repeats and subsets, as batch[idx]
    assert uids(sample.reorder(torch.tensor([True, False, True]))) == ["uid-0", "uid-1"]
    with pytest.raises(TypeError, match="sequence of row indices"):
        sample.reorder(3)
    with pytest.raises(IndexError, match="outside"):
        sample.reorder([7])


def test_to_returns_new_container(sample):
    moved = sample.to("cpu")
    assert moved is not sample and moved.batch is not sample.batch
    assert_dataproto_equal(moved, sample)
    moved.meta_info["x"] = 1
    assert "x" not in sample.meta_info


# ---------------------------------------------------------------- make_iterator


def test_make_iterator_covers_each_sample_once_per_epoch(sample_factory):
    data = sample_factory(8)
    batches = list(data.make_iterator(mini_batch_size=2, epochs=3, seed=7))
    assert len(batches) == 12 and all(len(b) == 2 for b in batches)
    for epoch in range(3):
        seen = sum((uids(b) for b in batches[epoch * 4 : (epoch + 1) * 4]), [])
        assert sorted(seen) == sorted(uids(data))
    orders = [sum((uids(b) for b in batches[e * 4 : (e + 1) * 4]), []) for e in range(3)]
    assert orders[0] != orders[1] or orders[1] != orders[2]  # epochs use different permutations


def test_make_iterator_is_reproducible_with_seed(sample_factory):
    data = sample_factory(8)
    first = [uids(b) for b in data.make_iterator(4, epochs=2, seed=1)]
    again = [uids(b) for b in data.make_iterator(4, epochs=2, seed=1)]
    assert first == again
    expected_epoch0 = [f"uid-{i}" for i in torch.randperm(8, generator=torch.Generator().manual_seed(1)).tolist()]
    assert first[0] + first[1] == expected_epoch0


def test_make_iterator_without_shuffle_and_errors(sample):
    assert [uids(b) for b in sample.make_iterator(3, epochs=1, shuffle=False)] == [
        ["uid-0", "uid-1", "uid-2"],
        ["uid-3", "uid-4", "uid-5"],
    ]
    with pytest.raises(ValueError, match="not divisible by mini_batch_size 4"):
        sample.make_iterator(4, epochs=1)
    with pytest.raises(ValueError, match="mini_batch_size"):
        sample.make_iterator(0, epochs=1)
