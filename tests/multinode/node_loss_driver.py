"""Driver of the node-loss tests that need no trainer, run on the multi-node cluster (RAY_ADDRESS). It places
a group of NodeProbe workers over two nodes, prints `PLACED {json}` (each rank's node) once the scenario is
under way, and `RESULT {json}` with the error it got and when. Scenarios (the first argument):
- `collective`: 2 ranks a node all-reduce until a node is lost;
- `lost_output`: 1 rank a node return outputs that stay on their nodes; once a node is lost, the driver
  fetches them (the lost node's output went with it)."""

from __future__ import annotations

import json
import sys
import time

import ray

from single_controller import NodeLostError, WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from single_controller.ray.node_loss import find_lost_nodes
from tests.multinode.cluster import PROBE_CPUS
from tests.multinode.workers import NodeProbe

PAUSE_S = 0.05
OUTPUT_BYTES = 1 << 20  # far above Ray's inline limit (100 KiB): each output lives on its rank's node
LOSS_TIMEOUT_S = 120


def collective(group: RayWorkerGroup) -> None:
    group.all_reduce_rank()  # the process group is up on every rank before the loss
    print("PLACED " + json.dumps([info.node_id for info in group.node_info]), flush=True)
    group.all_reduce_forever(PAUSE_S)


def lost_output(group: RayWorkerGroup) -> None:
    outputs = group.output_of(OUTPUT_BYTES)
    while not outputs.done():  # done() fetches nothing: the outputs stay where their ranks wrote them
        time.sleep(PAUSE_S)
    print("PLACED " + json.dumps([info.node_id for info in group.node_info]), flush=True)
    deadline = time.monotonic() + LOSS_TIMEOUT_S
    while not find_lost_nodes(group.node_info) and time.monotonic() < deadline:
        time.sleep(PAUSE_S)
    outputs.get()


SCENARIOS = {"collective": (collective, [2, 2]), "lost_output": (lost_output, [1, 1])}


def main() -> None:
    scenario, pool_shape = SCENARIOS[sys.argv[1]]
    ray.init()
    pool = RayResourcePool(pool_shape, use_gpu=False, name_prefix="loss_", cpus_per_process=PROBE_CPUS)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeProbe), name_prefix="loss")
    try:
        scenario(group)
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
