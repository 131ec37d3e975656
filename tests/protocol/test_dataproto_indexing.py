import copy

import numpy as np
import pytest
import torch

from protocol.data_proto import DataProto, DataProtoItem
from protocol.testing import assert_dataproto_equal, shares_memory


def test_int_index_returns_item(sample):
    item = sample[1]
    assert isinstance(item, DataProtoItem)
    assert torch.equal(item.batch["input_ids"], sample.batch["input_ids"][1])
    assert item.batch["extra", "logp"].shape == (3,)
    assert item.non_tensor_batch["uid"] == "uid-1"
    assert item.meta_info == sample.meta_info
    assert sample[-1].non_tensor_batch["uid"] == "uid-5"
    assert sample[np.int64(2)].non_tensor_batch["uid"] == "uid-2"
    assert sample[torch.tensor(3)].non_tensor_batch["uid"] == "uid-3"


def test_int_index_out_of_range(sample):
    with pytest.raises(IndexError, match="out of range"):
        sample[6]
    with pytest.raises(IndexError, match="out of range"):
        sample[-7]


def test_slice_is_a_view(sample):
    part = sample[1:4]
    assert len(part) == 3
    assert list(part.non_tensor_batch["uid"]) == ["uid-1", "uid-2", "uid-3"]
    assert shares_memory(part, sample)
    stepped = sample[::2]
    assert list(stepped.non_tensor_batch["uid"]) == ["uid-0", "uid-2", "uid-4"]
    backwards = sample[::-1]
    assert list(backwards.non_tensor_batch["uid"]) == [f"uid-{i}" for i in range(5, -1, -1)]
    assert torch.equal(backwards.batch["values"], sample.batch["values"].flip(0))


@pytest.mark.parametrize(
    "index",
    [
        [4, 0, -1],
        np.array([4, 0, 5]),
        torch.tensor([4, 0, 5]),
        torch.tensor([4, 0, 5], dtype=torch.int32),
    ],
    ids=["list", "numpy", "torch", "torch-int32"],
)
def test_index_arrays_copy_rows(sample, index):
    before = copy.deepcopy(sample)
    picked = sample[index]
    assert list(picked.non_tensor_batch["uid"]) == ["uid-4", "uid-0", "uid-5"]
    assert torch.equal(picked.batch["extra", "logp"], sample.batch["extra", "logp"][[4, 0, 5]])
    assert not shares_memory(picked, sample)
    assert_dataproto_equal(sample, before)


@pytest.mark.parametrize(
    "mask",
    [
        [True, False, True, False, False, True],
        np.array([True, False, True, False, False, True]),
        torch.tensor([True, False, True, False, False, True]),
    ],
    ids=["list", "numpy", "torch"],
)
def test_bool_masks(sample, mask):
    picked = sample[mask]
    assert list(picked.non_tensor_batch["uid"]) == ["uid-0", "uid-2", "uid-5"]
    assert picked.batch["bf"].dtype == torch.bfloat16


def test_bad_masks_and_positions(sample):
    with pytest.raises(IndexError, match="mask"):
        sample[np.array([True, False])]
    with pytest.raises(IndexError, match="outside"):
        sample[[0, 6]]


def test_empty_index_gives_empty_dataproto(sample):
    empty = sample[[]]
    assert len(empty) == 0 and empty.batch["values"].shape == (0, 4)


@pytest.mark.parametrize("index", [1.5, "a", {"a": 1}, torch.tensor([0.5]), np.array([0.5]), True, None])
def test_bad_index_kinds_raise_type_error(sample, index):
    with pytest.raises(TypeError, match=r"valid index kinds: int, slice"):
        sample[index]


def test_item_pickles(sample):
    import pickle

    item = pickle.loads(pickle.dumps(sample[2]))
    assert torch.equal(item.batch["bf"], sample.batch["bf"][2])
    assert item.non_tensor_batch["info"] == {"i": 2, "tags": [2, 3]}


def test_len_matches_batch(sample):
    assert len(sample) == 6 == sample.batch.batch_size[0]
    assert len(DataProto.from_dict({"x": torch.zeros(0, 2)})) == 0
