"""torch.distributed inside a group and mesh dispatch on a 2x2 mesh (placement over several nodes:
tests/multinode)."""

import torch

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.workers import DistributedWorker, MeshWorker, make_batch


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
