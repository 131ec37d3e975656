"""A Ray cluster of several nodes on this machine, for the multi-node tests: `python -m tests.multinode.cluster_host
'{"head_cpus": 1, "worker_cpus": [2, 2]}'`.

Every node is its own raylet with its own CPU count, all on 127.0.0.1 (a node on another loopback address such
as 127.0.0.2 makes Ray listen on every interface). The process answers one JSON line per request read from
stdin (`{"op": "remove", "node_id": ...}`, `{"op": "add", "num_cpus": 2}`, `{"op": "nodes"}`); it stops the
cluster when stdin closes, so the cluster never outlives the test session that started it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ray.cluster_utils import Cluster

LOOPBACK = "127.0.0.1"
OBJECT_STORE_BYTES = 200 << 20
# Ray checks each raylet every 3 s by default, so a killed node is declared dead ~15 s (5 missed checks) after
# it went; checking every second finds it in ~5 s. Each check still waits Ray's default 10 s for its answer and
# 5 must fail in a row, so a raylet that is merely slow on a loaded machine is not declared dead any sooner.
HEALTH_CHECK = {"health_check_period_ms": 1000}


def node_args(num_cpus: int) -> dict[str, Any]:
    return {"num_cpus": num_cpus, "node_ip_address": LOOPBACK, "object_store_memory": OBJECT_STORE_BYTES}


def reply(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    head = {**node_args(spec["head_cpus"]), "include_dashboard": False, "_system_config": HEALTH_CHECK}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    workers = {}
    for cpus in spec["worker_cpus"]:
        node = cluster.add_node(**node_args(cpus))
        workers[node.node_id] = node
    cluster.wait_for_nodes()

    def describe() -> dict[str, Any]:
        return {"address": cluster.address, "head": cluster.head_node.node_id, "workers": list(workers)}

    reply(describe())
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "remove":
            cluster.remove_node(workers.pop(request["node_id"]), allow_graceful=request.get("graceful", True))
        elif request["op"] == "add":
            node = cluster.add_node(**node_args(request["num_cpus"]))
            workers[node.node_id] = node
            cluster.wait_for_nodes()
        reply(describe())
    cluster.shutdown()


if __name__ == "__main__":
    main()
