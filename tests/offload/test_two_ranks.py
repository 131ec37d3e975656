"""Offload round trips of a model sharded unevenly over 2 Ray workers (padded FSDP2 shards), CPU and gloo."""

from __future__ import annotations

import pytest

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.offload.workers import OffloadProbe


@pytest.fixture(scope="module")
def probe(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(OffloadProbe), call_timeout_s=180.0)
    yield group
    group.kill()
    pool.release()


def test_uneven_shards_round_trip_bit_identically_and_train_as_before(probe):
    outs = probe.round_trips_and_training(5)
    assert len(outs) == 2
    for out in outs:
        assert out["changed"] == [] and out["same_objects"]
        assert out["losses"][0] == out["losses"][1]
        assert out["differs_from_plain"] == []
        assert out["host_allocations"] == 2  # one buffer for the parameters, one for the optimizer state
    # the uneven rows leave padding in the last rank's shard storage (FSDP2 pads to rank 0's shard size)
    assert "model.embed_tokens.weight" in outs[1]["padded_shards"]
