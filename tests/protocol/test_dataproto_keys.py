import copy

import numpy as np
import pytest
import torch

from protocol.data_proto import DataProto
from protocol.testing import assert_dataproto_equal, shares_memory

# ---------------------------------------------------------------- select


def test_select_subsets_each_field(sample):
    before = copy.deepcopy(sample)
    picked = sample.select(batch_keys=["input_ids", ("extra", "logp")], non_tensor_batch_keys=["uid"], meta_info_keys=["step"])
    assert sorted(map(str, picked.batch.keys(include_nested=True, leaves_only=True))) == sorted(
        ["input_ids", str(("extra", "logp"))]
    )
    assert list(picked.non_tensor_batch) == ["uid"]
    assert picked.meta_info == {"step": 3}
    assert shares_memory(picked, sample)  # like verl: select shares tensors unless deepcopy=True
    picked.meta_info["new"] = 1
    picked.batch["added"] = torch.zeros(6)
    picked.batch["extra"]["added"] = torch.zeros(6)
    assert_dataproto_equal(sample, before)  # containers are never shared


def test_select_none_means_all_and_empty_list_means_none(sample):
    everything = sample.select()
    assert_dataproto_equal(everything, sample)
    nothing = sample.select(batch_keys=[], non_tensor_batch_keys=[], meta_info_keys=[])
    assert len(nothing) == 6 and not list(nothing.batch.keys()) and not nothing.non_tensor_batch and not nothing.meta_info


def test_select_deepcopy_copies_everything(sample):
    picked = sample.select(deepcopy=True)
    assert not shares_memory(picked, sample)
    picked.non_tensor_batch["info"][0]["i"] = 99
    assert sample.non_tensor_batch["info"][0]["i"] == 0


def test_select_missing_keys_listed(sample):
    with pytest.raises(KeyError, match=r"batch key\(s\) \['nope', 'gone'\] not found; available batch keys: \[.*'input_ids'"):
        sample.select(batch_keys=["input_ids", "nope", "gone"])
    with pytest.raises(KeyError, match=r"non_tensor_batch key\(s\) \['x'\] not found.*'uid'"):
        sample.select(non_tensor_batch_keys=["x"])
    with pytest.raises(KeyError, match=r"meta_info key\(s\) \['x'\].*'temperature'"):
        sample.select(meta_info_keys="x")


# ---------------------------------------------------------------- pop


def test_pop_moves_keys_out_of_self(sample):
    values = sample.batch["values"]
    popped = sample.pop(batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=["step"])
    assert popped.batch["values"] is values
    assert list(popped.non_tensor_batch) == ["uid"] and popped.meta_info == {"step": 3}
    assert "values" not in sample.batch.keys()
    assert "uid" not in sample.non_tensor_batch and "step" not in sample.meta_info
    assert len(popped) == len(sample) == 6


def test_pop_none_pops_nothing(sample):
    before = copy.deepcopy(sample)
    popped = sample.pop()
    assert not list(popped.batch.keys()) and len(popped) == 6
    assert_dataproto_equal(sample, before)


def test_pop_checks_all_keys_before_removing(sample):
    before = copy.deepcopy(sample)
    with pytest.raises(KeyError, match=r"\['missing'\].*available"):
        sample.pop(batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=["missing"])
    assert_dataproto_equal(sample, before)


def test_pop_nested_leaf(sample):
    popped = sample.pop(batch_keys=[("extra", "mask")])
    assert popped.batch["extra", "mask"].dtype == torch.bool
    assert ("extra", "mask") not in sample.batch.keys(include_nested=True)
    assert ("extra", "logp") in sample.batch.keys(include_nested=True)


# ---------------------------------------------------------------- rename


def test_rename_returns_new_and_keeps_input(sample):
    before = copy.deepcopy(sample)
    renamed = sample.rename("values", "old_values")
    assert "old_values" in renamed.batch.keys() and "values" not in renamed.batch.keys()
    assert torch.equal(renamed.batch["old_values"], sample.batch["values"])
    assert not shares_memory(renamed, sample)
    assert_dataproto_equal(sample, before)
    swapped = sample.rename(["values", "input_ids"], ["input_ids", "values"])
    assert swapped.batch["values"].dtype == torch.int64


def test_rename_errors(sample):
    with pytest.raises(KeyError, match=r"\['nope'\] not found.*available"):
        sample.rename("nope", "x")
    with pytest.raises(ValueError, match=r"\['input_ids'\] already exist"):
        sample.rename("values", "input_ids")
    with pytest.raises(ValueError, match="as many new keys"):
        sample.rename(["values"], ["a", "b"])


# ---------------------------------------------------------------- union


def test_union_returns_new_with_all_keys(sample):
    other = DataProto.from_dict(
        {"input_ids": sample.batch["input_ids"].clone(), "old_logp": torch.randn(6)},
        {"uid": sample.non_tensor_batch["uid"].copy(), "reward": np.ones(6)},
        {"step": 3, "extra_meta": "x"},
    )
    before_self, before_other = copy.deepcopy(sample), copy.deepcopy(other)
    merged = sample.union(other)
    assert "old_logp" in merged.batch.keys() and "reward" in merged.non_tensor_batch
    assert merged.meta_info == {"temperature": 1.0, "step": 3, "extra_meta": "x"}
    assert not shares_memory(merged, sample) and not shares_memory(merged, other)
    assert_dataproto_equal(sample, before_self)
    assert_dataproto_equal(other, before_other)


def test_union_nested_keys_and_nan_equal(sample):
    left = sample.select(batch_keys=["values"])
    right = sample.select(batch_keys=["values", "extra"])
    left.batch["values"][0, 0] = float("nan")  # same storage: NaN on both sides is not a conflict
    merged = left.union(right)
    assert merged.batch["extra", "logp"].shape == (6, 3)


@pytest.mark.parametrize("field", ["batch", "non_tensor_batch", "meta_info"])
def test_union_conflict_names_key(sample, field):
    other = sample.select(deepcopy=True)
    if field == "batch":
        other.batch["values"][0, 0] += 1
        key = "values"
    elif field == "non_tensor_batch":
        other.non_tensor_batch["info"][0]["i"] = -1
        key = "info"
    else:
        other.meta_info["step"] = 4
        key = "step"
    with pytest.raises(ValueError, match=rf"{field} key '{key}' is in both DataProtos with different values"):
        sample.union(other)


def test_union_length_mismatch(sample):
    with pytest.raises(ValueError, match="length 6 with one of length 2"):
        sample.union(sample[:2])
