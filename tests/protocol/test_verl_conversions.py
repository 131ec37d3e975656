"""verl DataProto names that convert or combine batches: torch.cat on DataProtos, to_tensordict /
from_tensordict (nested non-tensor rows, as verl's agent loop stores them), the numpy serialization helpers,
and reorder in place. Expected values are written from verl 0.9.1's semantics, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from protocol import (
    DataProto,
    ProtocolTypeError,
    ProtocolValueError,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from protocol.testing import assert_dataproto_equal

# Rows as an agent loop keeps them: chat messages, per-turn scores (empty, floats, dicts, nested lists).
MESSAGES = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], [], [{"role": "user", "content": "2+2?"}]]
TURN_SCORES = [[], [0.5, 0.8], [{"acc": 1.0}, [0.1, [0.2]]]]


def agent_batch() -> DataProto:
    return DataProto.from_dict(
        {"input_ids": torch.arange(6).view(3, 2), "reward": torch.tensor([0.0, 1.0, 0.5])},
        {"messages": MESSAGES, "turn_scores": TURN_SCORES},
        meta_info={"temperature": 0.7, "global_steps": 4},
    )


# ---------------------------------------------------------------- torch.cat on DataProtos


def test_torch_cat_of_dataprotos_is_their_concat():
    a, b = agent_batch()[:1], agent_batch()[1:]
    a.meta_info["metrics"], b.meta_info["metrics"] = {"loss": 1.0}, {"loss": 2.0}
    for joined in (torch.cat([a, b]), torch.cat((a, b), 0), torch.concat([a, b], dim=0), torch.concatenate([a, b], axis=0)):
        assert isinstance(joined, DataProto)
        assert joined.batch["input_ids"].tolist() == [[0, 1], [2, 3], [4, 5]]
        assert joined.non_tensor_batch["messages"].tolist() == MESSAGES
        assert joined.meta_info == {"temperature": 0.7, "global_steps": 4, "metrics": {"loss": [1.0, 2.0]}}
    with pytest.raises(AssertionError, match=r"concatenates rows \(dim=0\), got dim=1"):
        torch.cat([a, b], dim=1)
    with pytest.raises(ProtocolTypeError, match=r"DataProtos mixed with \['Tensor'\]"):
        torch.cat([a, torch.zeros(1)])
    with pytest.raises(TypeError):  # other torch functions are not defined on DataProtos
        torch.stack([a, b])


# ---------------------------------------------------------------- to_tensordict / from_tensordict


def test_to_tensordict_lays_out_tensors_rows_and_meta_like_verl():
    data = agent_batch()
    td = data.to_tensordict()
    assert type(td) is TensorDict and td.batch_size == (3,)
    assert td["input_ids"] is data.batch["input_ids"]  # shared, not copied
    assert isinstance(td.get("messages"), NonTensorStack) and isinstance(td.get("temperature"), NonTensorData)
    assert td["messages"] == MESSAGES and td["turn_scores"] == TURN_SCORES
    assert td["temperature"] == 0.7 and td["global_steps"] == 4
    clash = DataProto.from_dict({"x": torch.zeros(2)}, {"x": ["a", "b"]})
    with pytest.raises(AssertionError, match=r"keys \['x'\] are in both batch and non_tensor_batch"):
        clash.to_tensordict()


def test_round_trip_keeps_nested_rows_and_meta_info():
    data = agent_batch()
    back = DataProto.from_tensordict(data.to_tensordict())
    assert_dataproto_equal(back, data)
    assert back.non_tensor_batch["turn_scores"].shape == (3,)  # one element per row, never a 2-D array
    assert back.non_tensor_batch["turn_scores"][2] == [{"acc": 1.0}, [0.1, [0.2]]]
    rows = back.chunk(3)  # the rows still index one sample each
    assert rows[1].non_tensor_batch["messages"].tolist() == [[]]


def test_from_tensordict_reads_a_tensordict_built_the_verl_way():
    td = TensorDict(
        {
            "values": torch.tensor([1.0, 2.0]),
            "uid": NonTensorStack.from_list([NonTensorData("a"), NonTensorData("b")]),
            "compute_loss": NonTensorData(False),
        },
        batch_size=[2],
    )
    data = DataProto.from_tensordict(td, meta_info={"step": 1})
    assert data.batch["values"].tolist() == [1.0, 2.0] and list(data.batch.keys()) == ["values"]
    assert data.non_tensor_batch["uid"].tolist() == ["a", "b"] and data.non_tensor_batch["uid"].dtype == object
    assert data.meta_info == {"step": 1, "compute_loss": False}
    only_tensors = DataProto.from_tensordict(TensorDict({"v": torch.zeros(4, 2)}, batch_size=[]))
    assert len(only_tensors) == 4  # rows from the first tensor when the TensorDict has no batch size
    with pytest.raises(AssertionError, match="exactly one batch dimension"):
        DataProto.from_tensordict(td, num_batch_dims=2)
    with pytest.raises(ProtocolTypeError, match="expects a TensorDict, got dict"):
        DataProto.from_tensordict({"values": torch.zeros(2)})


# ---------------------------------------------------------------- numpy serialization helpers


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([[1.5, -2.0], [3.25, 0.0]], dtype=torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.arange(12, dtype=torch.int64).view(3, 4).t(),  # not contiguous
        torch.zeros(2, 0),
    ],
    ids=["bfloat16", "bool", "transposed_int64", "empty"],
)
def test_serialize_single_tensor_round_trips(tensor):
    dtype_name, shape, data = serialize_single_tensor(tensor)
    assert dtype_name == str(tensor.dtype).removeprefix("torch.") and tuple(shape) == tuple(tensor.shape)
    assert isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.nbytes == tensor.numel() * tensor.element_size()
    expected = tensor.clone()
    back = deserialize_single_tensor((dtype_name, shape, data))
    assert back.dtype == tensor.dtype and torch.equal(back, expected)
    data[...] = 0  # the bytes may be a view of `tensor` (as in verl); the decoded tensor owns a copy
    assert torch.equal(back, expected)


def test_serialize_single_tensor_format_is_dtype_shape_bytes():
    dtype_name, shape, data = serialize_single_tensor(torch.tensor([1, 256], dtype=torch.int16))
    assert (dtype_name, tuple(shape)) == ("int16", (2,))
    assert data.tolist() == [1, 0, 0, 1]  # little-endian bytes of 1 and 256
    with pytest.raises(AssertionError, match="3 bytes do not hold a int16 tensor of shape \\[2\\]"):
        deserialize_single_tensor(("int16", (2,), np.zeros(3, dtype=np.uint8)))
    with pytest.raises(ProtocolValueError, match="'nope' is not a torch dtype name"):
        deserialize_single_tensor(("nope", (1,), np.zeros(1, dtype=np.uint8)))


def test_serialize_tensordict_round_trips_dense_and_jagged_tensors():
    jagged = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3), torch.arange(1)], layout=torch.jagged)
    td = TensorDict({"logp": torch.randn(3, 2), "ids": jagged}, batch_size=[3])
    batch_size, device, items = serialize_tensordict(td)
    assert batch_size == (3,) and device is None and set(items) == {"logp", "ids"}
    layout, parts = items["ids"]
    assert layout == "jagged" and [tuple(p[1]) for p in parts] == [(2,), (3,), (1,)]
    back = deserialize_tensordict((batch_size, device, items))
    assert back.batch_size == (3,) and torch.equal(back["logp"], td["logp"])
    assert [t.tolist() for t in back["ids"].unbind()] == [[0, 1], [0, 1, 2], [0]]
    with pytest.raises(ProtocolTypeError, match="'tag' holds NonTensorData"):
        serialize_tensordict(TensorDict({"tag": NonTensorData("x")}, batch_size=[3]))
    with pytest.raises(ProtocolValueError, match="encoded with 1 fields"):
        deserialize_tensordict(((1,), None, {"bad": ("x",)}))


# ---------------------------------------------------------------- reorder, as verl's batch balancing calls it


def test_reorder_is_in_place_like_verl_balance_batch():
    batch = agent_batch()
    global_idx = torch.tensor([2, 0, 1])
    batch.reorder(global_idx)  # verl's trainer ignores the return value
    assert batch.batch["reward"].tolist() == [0.5, 0.0, 1.0]
    assert batch.non_tensor_batch["messages"].tolist() == [MESSAGES[2], MESSAGES[0], MESSAGES[1]]
    assert batch.meta_info == {"temperature": 0.7, "global_steps": 4}
