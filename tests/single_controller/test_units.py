"""Dispatch-table pieces that need no cluster: mesh placement, NeedParallel split/join, validation."""

import numpy as np
import pytest
import torch

from single_controller import Dispatch, NeedParallel, Worker, register, register_dispatch_mode
from single_controller.dispatch import resolve_dispatch, valid_mode_names
from single_controller.mesh import placement_from_axes
from single_controller.need_parallel import join_values, split_value
from single_controller.shards import padding_in_chunk


def test_mesh_placement_row_major_and_default_collectors():
    shape = {"pp": 2, "dp": 2, "tp": 2}
    placements = [placement_from_axes(r, shape) for r in range(8)]
    assert [p.dp_rank for p in placements] == [0, 0, 1, 1, 0, 0, 1, 1]
    # Collect from tp=0 on the last pipeline stage (pp=1): ranks 4 and 6.
    assert [r for r, p in enumerate(placements) if p.is_collector] == [4, 6]


def test_mesh_placement_custom_collector_and_errors():
    assert placement_from_axes(1, {"dp": 2, "tp": 2}, collect_from={"tp": 1}).is_collector
    with pytest.raises(ValueError, match="data-parallel axis 'dp'"):
        placement_from_axes(0, {"tp": 2})
    with pytest.raises(ValueError, match="valid are the non-DP axes"):
        placement_from_axes(0, {"dp": 2, "tp": 2}, collect_from={"sp": 0})


def test_declare_mesh_checks_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    worker = Worker()
    with pytest.raises(ValueError, match="has 6 ranks but the group has 4 workers"):
        worker.declare_mesh("m", {"dp": 2, "tp": 3})
    assert worker.declare_mesh("m", {"dp": 2, "tp": 2}).dp_rank == 1
    with pytest.raises(LookupError, match="has not declared mesh 'other'"):
        worker.sc_mesh_placement("other")


@pytest.mark.parametrize("total,parts,expected", [(5, 2, [0, 1]), (4, 2, [0, 0]), (1, 3, [0, 1, 1]), (7, 3, [0, 0, 2])])
def test_padding_in_chunk(total, parts, expected):
    assert [padding_in_chunk(total, parts, i) for i in range(parts)] == expected


def test_split_and_join_round_trip():
    t = torch.arange(20).reshape(5, 4)
    assert torch.equal(join_values(split_value(t, 2), "batch"), t)
    assert torch.equal(join_values(split_value(t, 3, "seq"), "seq"), t)
    seqs = [[1, 2, 3], [4, 5]]
    parts = split_value(seqs, 2, "seq")
    assert parts == [[[1, 2], [4]], [[3], [5]]]
    assert join_values(parts, "seq") == seqs
    d = {"a": np.arange(6), "b": [1, 2, 3, 4, 5, 6]}
    joined = join_values(split_value(d, 4), "batch")
    assert np.array_equal(joined["a"], d["a"]) and joined["b"] == d["b"]


def test_need_parallel_rejects_bad_type_and_value():
    with pytest.raises(ValueError, match="must be one of"):
        NeedParallel([1], type="column")
    with pytest.raises(TypeError, match="splits lists"):
        split_value(3, 2)


def test_unknown_dispatch_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="valid modes") as info:
        register(dispatch_mode="no_such_mode")
    assert "dp_compute_proto" in str(info.value)
    with pytest.raises(ValueError, match="exactly the keys"):
        register(dispatch_mode={"dispatch_fn": print})


def test_new_modes_can_be_registered():
    register_dispatch_mode("first_rank_list", lambda g, *a, **k: ([list(x) for x in a], k), lambda g, o: o[0])
    assert "first_rank_list" in valid_mode_names()
    assert resolve_dispatch("first_rank_list").collect_fn(None, [7, 8]) == 7
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("first_rank_list", print, print)


def test_rank_zero_dispatch_implies_rank_zero_execution():
    from single_controller import Execute
    from single_controller.decorator import get_method_spec

    class W(Worker):
        @register(Dispatch.RANK_ZERO)
        def f(self):
            return 1

    assert get_method_spec(W.f).execute_mode == Execute.RANK_ZERO


@pytest.mark.parametrize("total,parts", [(5, 2), (7, 3), (1, 3), (8, 4), (2, 5)])
def test_shards_match_padding_then_chunking(total, parts):
    from protocol import DataProto, pad_dataproto_to_divisor
    from single_controller.dispatch import shard_dataproto
    from single_controller.shards import PaddedShard

    data = DataProto.from_dict({"x": torch.arange(total)}, {"uid": np.arange(total).astype(object)})
    padded, _ = pad_dataproto_to_divisor(data, parts)
    expected = padded.chunk(parts)
    shards = shard_dataproto(data, parts, "test")
    for i, (shard, want) in enumerate(zip(shards, expected)):
        pad = padding_in_chunk(total, parts, i)
        assert isinstance(shard, PaddedShard) == bool(pad)
        chunk = shard.data if isinstance(shard, PaddedShard) else shard
        assert torch.equal(chunk.batch["x"], want.batch["x"])
        assert list(chunk.non_tensor_batch["uid"]) == list(want.non_tensor_batch["uid"])
    # Full chunks are views of the caller's tensor, not copies.
    if not padding_in_chunk(total, parts, 0):
        assert shards[0].batch["x"].data_ptr() == data.batch["x"].data_ptr()


@pytest.mark.parametrize("gpus, valid", [(0.5, True), (1, True), (2, True), (0, False), (1.5, False), (-1, False)])
def test_a_pool_slot_takes_a_fraction_of_a_gpu_or_whole_gpus(gpus, valid):
    from single_controller.ray import RayResourcePool

    if valid:
        pool = RayResourcePool([1], use_gpu=True, gpus_per_process=gpus)
        assert pool._bundle()["GPU"] == gpus and pool.actor_resources()["num_gpus"] == gpus / pool.max_colocate_count
    else:
        with pytest.raises(ValueError, match="fraction in"):
            RayResourcePool([1], use_gpu=True, gpus_per_process=gpus)


def test_a_process_of_several_gpus_takes_its_whole_slot():
    from single_controller.ray import RayResourcePool

    assert RayResourcePool([1], use_gpu=True, gpus_per_process=2).actor_resources()["num_gpus"] == 2
    assert RayResourcePool([1], use_gpu=True).max_colocate_count == 10  # one GPU or less: groups share slots
    with pytest.raises(ValueError, match="max_colocate_count=3: a process of several GPUs takes its whole slot"):
        RayResourcePool([1], use_gpu=True, gpus_per_process=2, max_colocate_count=3)
