"""torch.distributed inside a group, mesh dispatch on a 2x2 mesh, and placement over two nodes."""

import json
import os
import subprocess
import sys
import textwrap

import torch

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.conftest import REPO_ROOT
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


_TWO_NODE_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray
    from ray.cluster_utils import Cluster
    from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from tests.single_controller.workers import DistributedWorker, EchoWorker
    # Two worker nodes of one CPU each (a head with no CPUs): ranks must land on different nodes.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    pool = RayResourcePool(process_on_nodes=[1, 1], use_gpu=False, max_colocate_count=2)
    echo = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker))
    dist = RayWorkerGroup(pool, RayClassWithInitArgs(DistributedWorker))
    dist.init_dist()
    print(json.dumps({"nodes": [i.node_id for i in echo.node_info], "worker_nodes": [n.node_id for n in nodes],
                      "ranks": [o["rank"] for o in echo.whoami()], "sum": dist.all_reduce_rank()}))
    ray.shutdown(); cluster.shutdown()
    """
)


def test_two_node_placement_with_cluster_utils():
    # Ray's one-machine mode keeps every node on 127.0.0.1 (tests/multinode has the full multi-node tests).
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _TWO_NODE_SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(set(seen["nodes"])) == 2 and set(seen["nodes"]) == set(seen["worker_nodes"])
    assert seen["ranks"] == [0, 1]
    assert seen["sum"] == [3.0, 3.0]
