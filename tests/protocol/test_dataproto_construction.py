import numpy as np
import pytest
import torch
from tensordict import TensorDict

from protocol.arrays import to_object_array
from protocol.data_proto import DataProto


def test_from_dict_splits_fields_and_keeps_lists_one_dimensional():
    data = DataProto.from_dict(
        tensors={"x": torch.zeros(3, 2)},
        non_tensors={"pairs": [[1, 2], [3, 4], [5, 6]], "uid": np.array(["a", "b", "c"], dtype=object)},
        meta_info={"k": 1},
    )
    assert len(data) == 3
    assert data.non_tensor_batch["pairs"].shape == (3,)
    assert data.non_tensor_batch["pairs"].dtype == object
    assert data.non_tensor_batch["pairs"][1] == [3, 4]
    assert data.meta_info == {"k": 1}


def test_from_dict_without_tensors_takes_length_from_non_tensors():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    assert len(data) == 2 and list(data.batch.keys()) == []
    assert len(DataProto.from_dict()) == 0
    assert len(DataProto()) == 0


def test_from_dict_length_mismatch_names_keys():
    with pytest.raises(ValueError, match=r"'y'.*length 2.*'x'.*length 3"):
        DataProto.from_dict({"x": torch.zeros(3), "y": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"'uid'.*length 2"):
        DataProto.from_dict({"x": torch.zeros(3)}, {"uid": ["a", "b"]})
    with pytest.raises(ValueError, match="0-dimensional"):
        DataProto.from_dict({"x": torch.tensor(1.0)})


def test_from_single_dict_routes_by_type():
    data = DataProto.from_single_dict(
        {"x": torch.ones(2, 2), "arr": np.arange(2), "lst": ["p", "q"]}, meta_info={"m": 0}
    )
    assert list(data.batch.keys()) == ["x"]
    assert sorted(data.non_tensor_batch) == ["arr", "lst"]
    assert data.meta_info == {"m": 0}
    with pytest.raises(TypeError, match=r"'bad'.*int"):
        DataProto.from_single_dict({"x": torch.ones(2), "bad": 3})


def test_to_object_array_never_builds_2d():
    array = to_object_array([[1, 2], [3, 4]])
    assert array.shape == (2,) and array[0] == [1, 2]
    assert to_object_array([]).shape == (0,)


def test_check_consistency_messages():
    batch = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has length 3 but the batch has 4 samples"):
        DataProto(batch=batch, non_tensor_batch={"uid": np.array(["a", "b", "c"], dtype=object)})
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] is list"):
        DataProto(batch=batch, non_tensor_batch={"uid": ["a", "b", "c", "d"]})
    with pytest.raises(ValueError, match="one batch dimension"):
        DataProto(batch=TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3]))
    with pytest.raises(TypeError, match="TensorDict"):
        DataProto(batch={"x": torch.zeros(2)})
    data = DataProto(batch=batch)
    data.non_tensor_batch["late"] = np.zeros(5)  # assignment is allowed; the next check catches it
    with pytest.raises(ValueError, match=r"\['late'\] has length 5"):
        data.check_consistency()


def test_repr_is_short_and_has_no_values(sample):
    text = repr(sample)
    assert text.startswith("DataProto(len=6, batch={input_ids: int64[6, 4]")
    assert "extra.logp: float32[6, 3]" in text
    assert "uid: object[6]" in text and "meta_info_keys=['temperature', 'step']" in text
    assert "tensor(" not in text and len(text) < 400


def test_nbytes_counts_tensor_elements_only(sample):
    expected = 6 * 4 * 8 + 6 * 4 * 4 + 6 * 2 * 2 + 6 * 1 + 6 * 3 * 4 + 6 * 3 * 1
    assert sample.nbytes == expected
    assert sample[:2].nbytes == expected // 3
