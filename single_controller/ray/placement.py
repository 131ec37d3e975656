"""Where a worker group's ranks landed: the rendezvous host they use and a one-line summary per group."""

from __future__ import annotations

from typing import Sequence

from single_controller.ray.local_cluster import LOOPBACK
from single_controller.worker import NodeInfo


def preset_master_addr(rank_node_ids: Sequence[str]) -> str | None:
    """The MASTER_ADDR to give rank 0 before it starts, from the Ray node of every rank.

    All ranks on one node: loopback, so the rendezvous stays off the network. Ranks on several nodes: None,
    and rank 0 takes its own node's address (what Ray calls the node's IP), which the other nodes reach.
    """
    return LOOPBACK if len(set(rank_node_ids)) == 1 else None


def _rank_range(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def describe_placement(node_info: Sequence[NodeInfo]) -> str:
    """'ranks 0-1 on node 3a457eb4c2f1 (10.0.0.1), ranks 2-3 on node 6aa965da0b7e (10.0.0.2)'."""
    runs: list[list] = []  # [first rank, last rank, info] per run of consecutive ranks on one node
    for info in sorted(node_info, key=lambda i: i.rank):
        if runs and runs[-1][2].node_id == info.node_id and runs[-1][1] == info.rank - 1:
            runs[-1][1] = info.rank
        else:
            runs.append([info.rank, info.rank, info])
    return ", ".join(f"{_rank_range(a, b)} on node {i.node_id[:12]} ({i.ip})" for a, b, i in runs)
