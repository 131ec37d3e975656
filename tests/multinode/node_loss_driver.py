"""Driver of the abrupt node-loss test, run on the multi-node cluster (RAY_ADDRESS): places a group of
NodeProbe workers over two nodes, prints `PLACED {json}` (each rank's node), then all-reduces until a node
is lost and prints `RESULT {json}` with the error it got and how long after the loss it came."""

from __future__ import annotations

import json
import time

import ray

from single_controller import NodeLostError, WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.multinode.cluster import PROBE_CPUS
from tests.multinode.workers import NodeProbe

PAUSE_S = 0.05


def main() -> None:
    ray.init()
    pool = RayResourcePool([2, 2], use_gpu=False, name_prefix="loss_", cpus_per_process=PROBE_CPUS)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeProbe), name_prefix="loss")
    group.all_reduce_rank()  # the process group is up on every rank before the loss
    print("PLACED " + json.dumps([info.node_id for info in group.node_info]), flush=True)
    try:
        group.all_reduce_forever(PAUSE_S)
        result = {"error": None}
    except WorkerGroupError as error:
        lost = error.lost_nodes if isinstance(error, NodeLostError) else {}
        result = {"error": type(error).__name__, "message": str(error), "ranks": error.ranks, "lost_nodes": lost}
    result["raised_at"] = time.time()
    group.kill()
    pool.release()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
