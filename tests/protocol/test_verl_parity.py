"""verl DataProto names a port relies on: construction options, unions, folding, row ops, concat meta merge,
auto-padding, and errors that are also AssertionErrors (docs/migrating_from_verl.md lists them)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    ProtocolTypeError,
    ProtocolValueError,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)
from protocol.testing import assert_dataproto_equal


def rows(n: int = 6) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n), "pair": torch.arange(2 * n).view(n, 2)},
        {"uid": [f"u{i}" for i in range(n)]},
        meta_info={"step": 1},
    )


# ---------------------------------------------------------------- construction


def test_from_dict_num_batch_dims_and_auto_padding():
    tensors = {"a": torch.zeros(4, 3), "b": torch.ones(4, 3, 2)}
    data = DataProto.from_dict(tensors, num_batch_dims=1, auto_padding=True)
    assert len(data) == 4 and data.is_padding_enabled()
    assert DataProtoConfig.auto_padding_key in data.meta_info
    assert not DataProto.from_dict(tensors).is_padding_enabled()
    with pytest.raises(AssertionError, match="exactly one batch dimension"):
        DataProto.from_dict(tensors, num_batch_dims=2)
    with pytest.raises(ProtocolValueError, match="disagree on their first 2 dims"):
        DataProto.from_dict({"a": torch.zeros(4, 3), "b": torch.zeros(4, 2)}, num_batch_dims=2)
    with pytest.raises(AssertionError, match="positive int"):
        DataProto.from_dict(tensors, num_batch_dims=0)
    with pytest.raises(AssertionError, match="has length 5 but 'a' has length 4"):
        DataProto.from_dict({"a": torch.zeros(4), "b": torch.zeros(5)})


def test_from_single_dict_splits_by_type_and_takes_auto_padding():
    data = DataProto.from_single_dict(
        {"ids": torch.arange(3), "uid": np.array(["a", "b", "c"], dtype=object)}, meta_info={"k": 1}, auto_padding=True
    )
    assert list(data.batch.keys()) == ["ids"] and list(data.non_tensor_batch) == ["uid"]
    assert data.meta_info["k"] == 1 and data.is_padding_enabled()


def test_data_proto_item_from_int_index():
    item = rows()[2]
    assert isinstance(item, DataProtoItem)
    assert int(item.batch["x"]) == 2 and item.non_tensor_batch["uid"] == "u2" and item.meta_info == {"step": 1}


# ---------------------------------------------------------------- unions


def test_union_tensor_dict_fills_the_first_in_place_and_rejects_conflicts():
    a = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    b = TensorDict({"x": torch.arange(3), "y": torch.ones(3)}, batch_size=[3])
    merged = union_tensor_dict(a, b)  # verl-ported code often ignores the return value: `a` itself gains the keys
    assert merged is a and sorted(a.keys()) == ["x", "y"] and sorted(b.keys()) == ["x", "y"]
    a = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    # verl asserts on a conflict: the error is an AssertionError whose message names the key
    with pytest.raises(AssertionError, match="key 'x' is in tensor_dict1 and tensor_dict2 with different values"):
        union_tensor_dict(a, TensorDict({"x": torch.zeros(3, dtype=torch.int64), "z": torch.ones(3)}, batch_size=[3]))
    assert list(a.keys()) == ["x"]  # a conflict adds nothing
    with pytest.raises(AssertionError, match=r"must have identical batch sizes, got \[3\] and \[2\]"):
        union_tensor_dict(a, TensorDict({}, batch_size=[2]))
    # verl compares with Tensor.equal: the same values in another dtype are no conflict; the first dict's tensor stays
    same_values = union_tensor_dict(a, TensorDict({"x": torch.arange(3, dtype=torch.int32)}, batch_size=[3]))
    assert same_values["x"].dtype == torch.int64


def test_union_numpy_dict_treats_nan_and_objects_as_values():
    a = {"s": np.array([1.0, np.nan]), "o": np.array([{"k": 1}, None], dtype=object)}
    b = {"s": np.array([1.0, np.nan]), "t": np.array(["p", "q"], dtype=object)}
    merged = union_numpy_dict(a, b)
    assert merged is a and sorted(a) == ["o", "s", "t"]
    with pytest.raises(AssertionError, match="key 's' is in tensor_dict1 and tensor_dict2 with different values"):
        union_numpy_dict(a, {"s": np.array([2.0, np.nan]), "u": np.array([1, 2])})
    assert "u" not in a
    with pytest.raises(ProtocolTypeError, match=r"tensor_dict2\['s'\] must be a numpy array"):
        union_numpy_dict(a, {"s": [1.0, 2.0]})


# ---------------------------------------------------------------- folding / column chunks / repeats


def test_fold_and_unfold_batch_dim_round_trip():
    data = rows(6)
    folded = fold_batch_dim(data, 2)
    assert len(folded) == 2 and folded.batch["pair"].shape == (2, 3, 2)
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1", "u2"], ["u3", "u4", "u5"]]
    assert folded.batch["x"].tolist() == [[0, 1, 2], [3, 4, 5]]  # row i of the fold holds samples i*3 .. i*3+2
    assert folded.batch.batch_size == (2,) and folded.meta_info == {"step": 1}
    assert data.non_tensor_batch["uid"].shape == (6,)  # input unchanged
    assert_dataproto_equal(unfold_batch_dim(folded, batch_dims=2), data)
    with pytest.raises(AssertionError, match="length 6 is not divisible by new_batch_size 4"):
        fold_batch_dim(data, 4)
    with pytest.raises(ProtocolValueError, match="must share their first 2 dims"):
        unfold_batch_dim(data, batch_dims=2)


def test_sample_level_repeat_repeats_each_row_its_own_count():
    data = rows(3)
    for counts in ([2, 0, 1], (2, 0, 1), np.array([2, 0, 1]), torch.tensor([2, 0, 1])):
        out = data.sample_level_repeat(counts)
        assert out.batch["x"].tolist() == [0, 0, 2] and out.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u2"]
    with pytest.raises(AssertionError, match="got 2 repeat counts for 3 rows"):
        data.sample_level_repeat([1, 1])
    with pytest.raises(ProtocolTypeError, match="repeat_times must be a list"):
        data.sample_level_repeat(2)


def test_unfold_column_chunks_splits_chosen_keys_and_repeats_the_rest():
    data = DataProto.from_dict(
        {"cols": torch.arange(8).view(2, 4), "x": torch.tensor([10, 20])}, {"tag": np.array([["a", "b"], ["c", "d"]])}
    )
    out = data.unfold_column_chunks(2, split_keys=["cols", "tag"])
    assert out.batch["cols"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["x"].tolist() == [10, 10, 20, 20]
    assert out.non_tensor_batch["tag"].tolist() == [["a"], ["b"], ["c"], ["d"]]
    repeated = data.unfold_column_chunks(2)
    assert repeated.batch["cols"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]
    assert repeated.non_tensor_batch["tag"].tolist() == [["a", "b"], ["a", "b"], ["c", "d"], ["c", "d"]]
    # like verl, a split key that this DataProto does not have is ignored (the others still split)
    partly = data.unfold_column_chunks(2, split_keys=["cols", "not_here"])
    assert partly.batch["cols"].tolist() == out.batch["cols"].tolist() and partly.non_tensor_batch["tag"].shape == (4, 2)
    with pytest.raises(AssertionError, match="'cols' has shape \\[2, 4\\]; its second dimension must be divisible by n_split=3"):
        data.unfold_column_chunks(3, split_keys=["cols"])
    with pytest.raises(ProtocolTypeError, match="split_keys must be a list of keys"):
        data.unfold_column_chunks(2, split_keys="cols")


def test_select_idxs_and_slice():
    data = rows(6)
    assert data.select_idxs([4, 1]).batch["x"].tolist() == [4, 1]
    assert data.select_idxs(np.array([True, False] * 3)).batch["x"].tolist() == [0, 2, 4]
    assert data.select_idxs(torch.tensor([5])).non_tensor_batch["uid"].tolist() == ["u5"]
    assert data.slice(1, 5, 2).batch["x"].tolist() == [1, 3]
    assert data.slice().batch["x"].tolist() == list(range(6))


# ---------------------------------------------------------------- concat meta_info


def test_concat_gathers_metrics_per_key_and_rejects_conflicting_meta():
    parts = rows(4).chunk(2)
    parts[0].meta_info["metrics"] = {"loss": 0.5, "lr": 1e-3}
    parts[1].meta_info["metrics"] = [{"loss": 0.7, "lr": 1e-3}]
    merged = DataProto.concat(parts)
    assert merged.meta_info == {"step": 1, "metrics": {"loss": [0.5, 0.7], "lr": [1e-3, 1e-3]}}
    parts[1].meta_info["step"] = 2
    with pytest.raises(AssertionError, match=r"meta_info\['step'\] is 1 in item 0 but 2 in item 1"):
        DataProto.concat(parts)
    parts[1].meta_info["metrics"] = 3.0
    parts[1].meta_info["step"] = 1
    with pytest.raises(ProtocolTypeError, match="item 1 has meta_info\\['metrics'\\] of type float"):
        DataProto.concat(parts)


# ---------------------------------------------------------------- padding


def test_auto_padding_lets_chunk_split_uneven_lengths():
    plain = rows(5)
    with pytest.raises(AssertionError, match="cannot chunk a DataProto of length 5 into 2"):
        plain.chunk(2)
    padded = DataProto.from_dict({"x": torch.arange(5)}, auto_padding=True)
    assert [p.batch["x"].tolist() for p in padded.chunk(2)] == [[0, 1, 2], [3, 4]]
    DataProtoConfig.auto_padding = True
    try:
        assert plain.is_padding_enabled()
        assert [len(p) for p in plain.chunk(3)] == [2, 2, 1]
    finally:
        DataProtoConfig.auto_padding = False
    assert not plain.is_padding_enabled()
    with pytest.raises(AssertionError, match="must be a bool"):
        DataProtoConfig.auto_padding = "yes"


def test_pad_and_unpad_functions_and_in_place_padding_refused():
    data = rows(5)
    padded, pad = pad_dataproto_to_divisor(data, 4)
    assert pad == 3 and padded.batch["x"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert_dataproto_equal(unpad_dataproto(padded, pad), data)
    with pytest.raises(AssertionError, match="pad_to_divisor"):
        data.padding(3)
    assert len(data) == 5


# ---------------------------------------------------------------- errors that are AssertionErrors, guarded batch


def test_checks_verl_asserts_are_assertion_errors():
    data = rows(4)
    with pytest.raises(AssertionError, match=r"batch key\(s\) \['nope'\] not found"):
        data.pop(batch_keys=["nope"])
    with pytest.raises(KeyError):
        data.pop(batch_keys=["nope"])
    with pytest.raises(AssertionError, match="with different values"):
        data.union(DataProto.from_dict({"x": torch.zeros(4, dtype=torch.int64)}))
    with pytest.raises(AssertionError, match="not divisible by mini_batch_size 3"):
        data.make_iterator(3, epochs=1)


def test_assigning_a_dataproto_into_batch_raises_at_the_assignment():
    data = rows(4)
    output = DataProto.from_dict({"ref_log_prob": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"batch\['ref_log_prob'\].*output.batch\['ref_log_prob'\]"):
        data.batch["ref_log_prob"] = output
    with pytest.raises(AssertionError, match=r"cannot store a DataProto in batch\['other'\]"):
        data.batch.set("other", output)
    with pytest.raises(TypeError, match="DataProtoItem"):
        data.batch["item"] = output[0]
    assert "ref_log_prob" not in data.batch.keys()
    data.batch["ref_log_prob"] = output.batch["ref_log_prob"]  # the fix the message names
    assert data.batch["ref_log_prob"].shape == (4,)
    # derived DataProtos keep the guard
    for derived in (data[1:3], data[[0, 1]], DataProto.concat([data, data]), copy.deepcopy(data), data.select(["x"])):
        with pytest.raises(TypeError, match="cannot store a DataProto"):
            derived.batch["bad"] = output


def test_make_iterator_takes_dataloader_shuffle():
    data = rows(4)
    ordered = [b.batch["x"].tolist() for b in data.make_iterator(2, epochs=1, dataloader_kwargs={})]
    assert ordered == [[0, 1], [2, 3]]
    shuffled = [b.batch["x"].tolist() for b in data.make_iterator(2, epochs=3, seed=3, dataloader_kwargs={"shuffle": True})]
    assert any(batch != expected for batch, expected in zip(shuffled, ordered * 3))
    with pytest.raises(AssertionError, match=r"dataloader_kwargs \['num_workers'\] are not supported"):
        data.make_iterator(2, epochs=1, dataloader_kwargs={"num_workers": 2})


def test_print_size_and_get_data_info(capsys):
    data = rows(2)
    data.print_size(prefix="rows")
    assert capsys.readouterr().out.startswith("rows, Size of tensordict:")
    info = data.get_data_info()
    assert "x: (2,) (torch.int64) cpu" in info and "uid: ndarray(2,) (object)" in info and "step: int" in info
