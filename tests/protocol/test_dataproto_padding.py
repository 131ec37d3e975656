import copy

import pytest

from protocol.data_proto import DataProto
from protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from protocol.testing import assert_dataproto_equal, shares_memory


def test_uneven_padding_round_trip(sample_factory):
    data = sample_factory(5)
    before = copy.deepcopy(data)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert (len(padded), pad_size) == (8, 3)
    assert list(padded.non_tensor_batch["uid"]) == [f"uid-{i}" for i in [0, 1, 2, 3, 4, 0, 1, 2]]
    assert not shares_memory(padded, data)
    restored = unpad_dataproto(padded, pad_size)
    assert_dataproto_equal(restored, data)
    assert not shares_memory(restored, padded)
    assert_dataproto_equal(data, before)
    assert len(padded.chunk(4)) == 4


def test_padding_longer_than_data_repeats_cyclically(sample_factory):
    data = sample_factory(2)
    padded, pad_size = data.pad_to_divisor(7)
    assert (len(padded), pad_size) == (7, 5)
    assert list(padded.non_tensor_batch["uid"]) == ["uid-0", "uid-1"] * 3 + ["uid-0"]
    assert_dataproto_equal(padded.unpad(pad_size), data)


def test_no_padding_needed_still_returns_a_copy(sample):
    padded, pad_size = sample.pad_to_divisor(3)
    assert pad_size == 0 and padded is not sample
    assert not shares_memory(padded, sample)
    assert_dataproto_equal(padded, sample)
    assert_dataproto_equal(padded.unpad(0), sample)


def test_padding_errors(sample):
    with pytest.raises(ValueError, match="size_divisor must be a positive int"):
        sample.pad_to_divisor(0)
    with pytest.raises(ValueError, match="empty"):
        DataProto.from_dict().pad_to_divisor(2)
    with pytest.raises(ValueError, match="pad_size"):
        sample.unpad(7)
