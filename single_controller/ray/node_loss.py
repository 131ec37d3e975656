"""Which of a worker group's nodes Ray has declared dead, so that an error names the lost node and its ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, ObjectLostError, RayTaskError

from single_controller.worker import NodeInfo

# What a collective raises on the surviving ranks when a peer's process is gone (gloo, NCCL, the TCP store).
PEER_LOSS_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited",
    "NCCL communicator was aborted",
    "Broken pipe",
)
# When ranks lost their peers or their actors became unreachable, how long to wait for Ray to declare a
# node dead: a node shut down declares itself at once, an abruptly lost one is declared by Ray's health
# check (about 15 s with Ray's default settings when its port refuses connections, longer on a timeout).
NODE_LOSS_WAIT_S = 30.0
NODE_LOSS_POLL_S = 1.0


@dataclass(frozen=True)
class LostNode:
    node_id: str
    ip: str
    reason: str  # Ray's words, e.g. "received SIGTERM", "health check failed due to missing too many heartbeats"
    ranks: tuple[int, ...]

    def describe(self) -> str:
        why = f" (Ray: {self.reason})" if self.reason else ""
        return f"node {self.node_id} ({self.ip}) was lost{why}; ranks {list(self.ranks)} ran on it"


def find_lost_nodes(node_info: Sequence[NodeInfo]) -> list[LostNode]:
    """The nodes holding ranks of `node_info` that Ray lists as dead now."""
    used = {info.node_id for info in node_info}
    lost = []
    for node in ray.nodes():
        if node["NodeID"] in used and not node.get("Alive", True):
            ranks = tuple(sorted(info.rank for info in node_info if info.node_id == node["NodeID"]))
            ip = next(info.ip for info in node_info if info.node_id == node["NodeID"])
            lost.append(LostNode(node["NodeID"], ip, node.get("DeathReasonMessage") or "", ranks))
    return lost


def node_may_be_lost(errors: Sequence[BaseException]) -> bool:
    """Whether the failures look like a node Ray has not declared dead yet: a worker unreachable, an object
    lost (a rank's output, or a worker's input handed from another group), or a collective that lost its
    peers; and no worker that Ray already knows to be dead (a process death)."""
    if any(isinstance(error, ActorDiedError) for error in errors):
        return False
    return any(
        isinstance(error, (ActorUnavailableError, ObjectLostError))
        or (isinstance(error, RayTaskError) and isinstance(error.cause, ObjectLostError))
        or any(marker in str(error) for marker in PEER_LOSS_MARKERS)
        for error in errors
    )


def wait_for_lost_nodes(
    node_info: Sequence[NodeInfo], pending: list[ray.ObjectRef], timeout_s: float = NODE_LOSS_WAIT_S
) -> list[LostNode]:
    """Poll until Ray declares a node of `node_info` dead (returns its nodes), Ray reports a `pending`
    worker dead (a process died: the empty list, unless its node is dead), or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        lost = find_lost_nodes(node_info)
        if lost or time.monotonic() >= deadline:
            return lost
        if pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=NODE_LOSS_POLL_S)
            if any(_died(ref) for ref in ready):
                return find_lost_nodes(node_info)
        else:
            time.sleep(NODE_LOSS_POLL_S)


def _died(ref: ray.ObjectRef) -> bool:
    try:
        ray.get(ref)
    except ActorDiedError:
        return True
    except Exception:  # noqa: BLE001 - any other outcome (a result, a raised error) is not a death
        pass
    return False
