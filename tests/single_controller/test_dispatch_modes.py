"""Every built-in dispatch mode on a real two-worker group, including uneven batches and a custom dict."""

import pytest
import torch

from protocol import DataProto
from single_controller import NeedParallel
from single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from tests.single_controller.workers import CustomDispatchWorker, EchoWorker, make_batch


@pytest.fixture(scope="module")
def echo(cpu_pool_2):
    return RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=100), name_prefix="echo")


def test_one_to_all_reaches_every_rank_with_env(echo):
    out = echo.whoami("hello")
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["world_size"] for o in out} == {2}
    assert {o["tag"] for o in out} == {"hello"}
    assert len({o["pid"] for o in out}) == 2


def test_all_to_all_sends_one_entry_per_rank(echo):
    assert echo.add_rank([10, 20]) == [10, 21]


def test_all_to_all_rejects_wrong_length_with_clear_message(echo):
    with pytest.raises(ValueError, match=r"lists of length 2"):
        echo.add_rank([1, 2, 3])


def test_dp_compute_takes_presplit_lists(echo):
    assert echo.double([[1, 2], [3]]) == [[2, 4], [6]]


@pytest.mark.parametrize("n", [1, 4, 5, 7])
def test_dp_compute_proto_pads_uneven_batches_and_unpads_output(echo, n):
    data = make_batch(n)
    out = echo.plus_offset(data)
    assert len(out) == n
    assert torch.equal(out.batch["x"], torch.arange(n))
    assert torch.equal(out.batch["y"], torch.arange(n) + 100)
    # Contiguous split: the first ceil(n/2) rows went to rank 0.
    first = -(-n // 2)
    assert out.batch["rank"].tolist() == [0] * first + [1] * (n - first)
    assert len(data) == n and "y" not in data.batch.keys()  # the input was not touched


def test_dp_compute_metric_returns_list_of_chunk_results(echo):
    out = echo.chunk_sizes(make_batch(6))
    assert [o["rows"] for o in out] == [3, 3]
    assert sum(o["sum"] for o in out) == sum(range(6))


def test_dp_compute_proto_rejects_non_dataproto(echo):
    with pytest.raises(TypeError, match="expects DataProto"):
        echo.plus_offset([1, 2, 3])


def test_rank_zero_runs_only_rank_zero(echo):
    before = echo.get_state()
    assert echo.only_rank_zero() == 0
    after = echo.get_state()
    assert after[0] == before[0] + 1 and after[1] == before[1]


def test_execute_rank_zero_mode(echo):
    before = echo.get_state()
    assert echo.rank_zero_execute() == [0]
    after = echo.get_state()
    assert after[0] == before[0] + 10 and after[1] == before[1]


def test_need_parallel_splits_marked_arguments_only(echo):
    out = echo.summarize_parts(NeedParallel([1, 2, 3, 4, 5]), scale=3)
    assert [o["items"] for o in out] == [[1, 2, 3], [4, 5]]
    assert [o["scale"] for o in out] == [3, 3]


def test_split_join_rejoins_batch_and_sequence_splits(echo):
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert torch.equal(echo.scale_tensor(NeedParallel(values), 2.0), values * 2)
    assert torch.equal(echo.scale_tensor(NeedParallel(values, type="seq"), 3.0), values * 3)


def test_custom_dispatch_dict(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(CustomDispatchWorker))
    out = group.tag_rows(make_batch(3))
    assert len(out) == 6
    assert list(out.non_tensor_batch["tag"]) == ["tag0"] * 3 + ["tag1"] * 3
    assert isinstance(out, DataProto)


def test_generic_execute_helpers(echo):
    assert [o["rank"] for o in echo.execute_all("whoami", "t")] == [0, 1]
    assert echo.execute_rank_zero("whoami", "z")["tag"] == "z"
    assert echo.execute_all("add_rank", [5, 6]) == [5, 7]


def test_value_sent_to_several_ranks_is_put_once(ray_cluster):
    from single_controller.ray.shared_objects import SharedObjects

    data = make_batch(4)
    shared = SharedObjects()
    first, second = shared.place(data, [data, data]), shared.place(data, [data, data])
    assert isinstance(first, ray_cluster.ObjectRef) and first == second
    other = make_batch(4)
    assert shared.place(other, [other, data]) is other  # sent to one rank only: left to Ray


@pytest.mark.parametrize("rows", [10, 300_001])  # small chunks travel inline, large ones are read in place
def test_workers_may_write_to_received_chunks_without_touching_driver_data(echo, rows):
    data = DataProto.from_dict({"x": torch.arange(rows, dtype=torch.float64)})
    out = echo.increment_in_place(data)
    assert torch.equal(out.batch["x"], torch.arange(rows, dtype=torch.float64) + 1)
    assert torch.equal(data.batch["x"], torch.arange(rows, dtype=torch.float64))
    again = echo.increment_in_place(data)  # nothing was left modified in a store the call reused
    assert torch.equal(again.batch["x"], out.batch["x"])
