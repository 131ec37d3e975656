"""torch.distributed inside a group and mesh dispatch on a 2x2 mesh (placement over several nodes:
tests/multinode)."""

import time

import pytest
import ray
import torch

from single_controller import WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.workers import (
    DistributedWorker,
    InitJoinsDistributedWorker,
    MeshWorker,
    Rank0FailsInInitWorker,
    make_batch,
)


def test_gloo_all_reduce_across_group(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(DistributedWorker), name_prefix="dist")
    ports = group.init_dist()
    assert len(set(ports)) == 1  # every rank got rank 0's reserved master port
    assert group.all_reduce_rank() == [3.0, 3.0]  # 1 + 2


def test_two_groups_get_distinct_master_ports(cpu_pool_2):
    a = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(DistributedWorker))
    b = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(DistributedWorker))
    port_a, port_b = a.init_dist()[0], b.init_dist()[0]
    assert port_a != port_b
    assert a.all_reduce_rank() == b.all_reduce_rank() == [3.0, 3.0]


def test_ranks_start_together_so_init_can_join_the_process_group(cpu_pool_2):
    # Every rank has the master address before its __init__ and none waits for another's __init__.
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(InitJoinsDistributedWorker), name_prefix="init_joins")
    try:
        assert group.all_reduce_rank() == [3.0, 3.0]
    finally:
        group.kill()


def _pool_cpus_in_use(pool: RayResourcePool) -> float:
    keys = [f"CPU_group_{pg.id.hex()}" for pg in pool.placement_groups()]
    total, available = ray.cluster_resources(), ray.available_resources()
    return sum(total.get(k, 0.0) - available.get(k, 0.0) for k in keys)


def test_rank0_failing_in_init_is_named_and_the_other_ranks_are_killed(cpu_pool_2):
    before = _pool_cpus_in_use(cpu_pool_2)  # groups of earlier tests may still hold slots
    with pytest.raises(WorkerGroupError, match="rank 0 failed to start:(.|\\n)*rank 0 cannot load its model"):
        RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(Rank0FailsInInitWorker), name_prefix="rank0_fails")
    # Rank 1 started beside rank 0 and was killed with it: the pool's CPUs come back.
    deadline = time.monotonic() + 30
    while _pool_cpus_in_use(cpu_pool_2) > before:
        assert time.monotonic() < deadline, f"{_pool_cpus_in_use(cpu_pool_2) - before} CPUs of the pool still held"
        time.sleep(0.1)


def test_mesh_dispatch_on_2x2_mesh(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[4], use_gpu=False)
    try:
        group = RayWorkerGroup(pool, RayClassWithInitArgs(MeshWorker), name_prefix="mesh")
        layout = group.init_mesh(2, 2)
        assert [(p["dp_rank"], p["collector"]) for p in layout] == [(0, True), (0, False), (1, True), (1, False)]
        out = group.compute(make_batch(5))  # uneven over dp=2: padded, then unpadded
        assert torch.equal(out.batch["x"], torch.arange(5))
        # Collected from the tp=0 rank of each DP group: ranks 0 and 2.
        assert out.batch["seen_by"].tolist() == [0, 0, 0, 2, 2]
    finally:
        pool.release()
