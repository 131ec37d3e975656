"""Non-blocking calls and handing their results to another group without the driver fetching them."""

import pytest
import torch

from protocol import DataProtoFuture
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.workers import EchoWorker, make_batch


@pytest.fixture(scope="module")
def groups(cpu_pool_2):
    producer = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=1), name_prefix="producer")
    consumer = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="consumer")
    return producer, consumer


def _forbid_driver_fetch(future: DataProtoFuture) -> None:
    # Every driver-side fetch of this future's outputs goes through its fetch_fn or get: make both fail.
    future.fetch_fn = lambda refs: pytest.fail("the driver fetched the producer's outputs")
    future.get = lambda: pytest.fail("DataProtoFuture.get of the producer on the driver")


def test_non_blocking_returns_future_and_get_collects(groups):
    producer, _ = groups
    future = producer.plus_offset_async(make_batch(5))
    assert isinstance(future, DataProtoFuture)
    assert len(future.chunk_refs) == 2
    out = future.get()
    assert torch.equal(out.batch["y"], torch.arange(5) + 1)


def test_future_is_handed_worker_to_worker(groups):
    producer, consumer = groups
    future = producer.plus_offset_async(make_batch(6))
    _forbid_driver_fetch(future)
    out = consumer.record_sources(future)
    assert torch.equal(out.batch["x"], torch.arange(6))
    assert torch.equal(out.batch["y"], torch.arange(6) + 1)
    assert out.batch["consumer_rank"].tolist() == [0, 0, 0, 1, 1, 1]


def test_future_chunks_are_resplit_for_a_group_of_another_size(ray_cluster, groups):
    producer, _ = groups
    pool3 = RayResourcePool(process_on_nodes=[3], use_gpu=False)
    try:
        consumer3 = RayWorkerGroup(pool3, RayClassWithInitArgs(EchoWorker), name_prefix="consumer3")
        future = producer.plus_offset_async(make_batch(7))
        _forbid_driver_fetch(future)
        out = consumer3.record_sources(future)
        assert torch.equal(out.batch["x"], torch.arange(7))
        assert torch.equal(out.batch["y"], torch.arange(7) + 1)
        assert out.batch["consumer_rank"].tolist() == [0, 0, 0, 1, 1, 1, 2]
    finally:
        pool3.release()
