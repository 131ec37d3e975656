"""Driver of the placement tests, run on the multi-node cluster (RAY_ADDRESS): places worker groups over
two nodes (one group, colocated roles, separate groups), reads back where each rank runs and what
rendezvous environment it sees, and all-reduces across the nodes. Prints `RESULT {json}`."""

from __future__ import annotations

import json
import sys
import time

import ray

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
from single_controller.ray.placement import preset_master_addr
from tests.multinode.cluster import PROBE_CPUS
from tests.multinode.workers import NodeProbe


def one_group() -> dict:
    pool = RayResourcePool([2, 2], use_gpu=False, name_prefix="probe_", cpus_per_process=PROBE_CPUS)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeProbe), name_prefix="probe")
    try:
        return {
            "pool_nodes": pool.node_ids(),
            "preset_master_addr": preset_master_addr([slot.node_id for slot in pool.rank_slots()]),
            "where": group.where(),
            "all_reduce": group.all_reduce_rank(),
            "placement": group.describe_placement(),
        }
    finally:
        group.kill()
        pool.release()


def colocated_roles() -> dict:
    pool = RayResourcePool([2, 2], use_gpu=False, name_prefix="colocated_", cpus_per_process=PROBE_CPUS)
    group = RayWorkerGroup(pool, create_colocated_worker_cls({"first": NodeProbe, "second": NodeProbe}), name_prefix="colocated")
    roles = group.spawn()
    try:
        return {
            "first": roles["first"].where(),
            "second": roles["second"].where(),
            "all_reduce": roles["first"].all_reduce_rank(),
        }
    finally:
        group.kill()
        pool.release()


def separate_groups() -> dict:
    pools = [
        RayResourcePool([1, 1], use_gpu=False, name_prefix=f"{n}_", cpus_per_process=PROBE_CPUS) for n in ("a", "b")
    ]
    groups = [RayWorkerGroup(p, RayClassWithInitArgs(NodeProbe), name_prefix=f"separate_{i}") for i, p in enumerate(pools)]
    try:
        return {
            "where": [g.where() for g in groups],
            "all_reduce": [g.all_reduce_rank() for g in groups],
        }
    finally:
        for group, pool in zip(groups, pools):
            group.kill()
            pool.release()


def wait_for_released_cpus(timeout_s: float = 60.0) -> None:
    """Placement groups are removed asynchronously: the next case picks its target nodes from the free
    CPUs, so it starts only once the previous case's reservations are back (else two soft targets can
    collapse onto the one node that still has room)."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CPUs not released after {timeout_s:.0f}s: {ray.available_resources()}")
        time.sleep(0.2)


def main() -> None:
    ray.init()
    result = {"node_ips": {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}}
    for case in (one_group, colocated_roles, separate_groups):
        wait_for_released_cpus()
        started = time.monotonic()
        result[case.__name__] = case()
        print(f"{case.__name__}: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
