"""`RayResourcePool`: processes reserved on nodes as Ray placement groups (one STRICT_PACK group per node)."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from single_controller.ray.worker_lifetime import remove_after_closing

PG_READY_TIMEOUT_S = 60.0
CLOSE_WAIT_S = 60.0  # as RayWorkerGroup.close: then the placement goes, and its actors with it


@dataclass(frozen=True)
class RankSlot:
    """Where one rank of a worker group goes."""

    placement_group: PlacementGroup
    bundle_index: int
    local_rank: int  # among the pool's ranks on the same Ray node
    local_world_size: int
    node_id: str  # the Ray node the slot's placement group was reserved on


class RayResourcePool:
    """Reserve `process_on_nodes[i]` processes on node i.

    Each process slot is a bundle of `cpus_per_process` CPUs (and `gpus_per_process` GPUs when `use_gpu`,
    e.g. a tensor-parallel engine that starts its own per-GPU processes); up to
    `max_colocate_count` worker groups can share the pool, each actor taking that fraction of its slot
    (default 10; 1 for processes of several GPUs: Ray shows an actor asking a fraction of a multi-GPU slot only
    one of its GPUs, so such a process takes its whole slot and sees every GPU of it).
    A `gpus_per_process` below 1 lets pools share a GPU (e.g. 0.5 each: a trainer and a rollout engine on one
    GPU, in two pools); Ray decides which GPU each fractional slot lands on.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = True,
        max_colocate_count: int | None = None,
        name_prefix: str = "",
        cpus_per_process: float = 1.0,
        detached: bool = False,
        gpus_per_process: float = 1,
    ) -> None:
        if not process_on_nodes or any(not isinstance(n, int) or n < 1 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be a non-empty list of positive ints, got {process_on_nodes!r}")
        if not gpus_per_process > 0 or (gpus_per_process > 1 and gpus_per_process != int(gpus_per_process)):
            raise ValueError(
                f"gpus_per_process must be a fraction in (0, 1] or a whole number of GPUs, got {gpus_per_process}"
            )
        several_gpus = use_gpu and gpus_per_process > 1
        if max_colocate_count is None:
            max_colocate_count = 1 if several_gpus else 10
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        if several_gpus and max_colocate_count != 1:
            raise ValueError(
                f"gpus_per_process={gpus_per_process} with max_colocate_count={max_colocate_count}: a process "
                "of several GPUs takes its whole slot (Ray would show an actor asking a share of it only one "
                "GPU); leave max_colocate_count unset (1) or give each colocated group a pool of its own"
            )
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.name_prefix = name_prefix
        self.cpus_per_process = cpus_per_process
        self.detached = detached
        self.gpus_per_process = gpus_per_process
        self._placement_groups: list[PlacementGroup] | None = None
        self._group_counts: list[int] = []  # processes per placement group, in rank order
        self._group_nodes: list[str] = []  # the Ray node of each placement group, in rank order
        self._remove_when_dropped: weakref.finalize | None = None
        # Close calls to the workers of groups dropped without kill(): the placement groups wait for them.
        self.closing_calls: list[ray.ObjectRef] = []

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def actor_resources(self) -> dict[str, float]:
        """Resources one actor of one colocated group takes from its slot."""
        share = 1.0 / self.max_colocate_count
        return {
            "num_cpus": self.cpus_per_process * share,
            "num_gpus": self.gpus_per_process * share if self.use_gpu else 0.0,
        }

    def _bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            bundle["GPU"] = float(self.gpus_per_process)
        return bundle

    def _target_nodes(self) -> list[str | None]:
        # Steer each node's group to a different node that can hold it; Ray treats this as a hint.
        if len(self.process_on_nodes) == 1:
            return [None]
        alive = alive_nodes()
        targets: list[str | None] = []
        used: set[str] = set()
        for count in self.process_on_nodes:
            need = {k: v * count for k, v in self._bundle().items()}
            fits = [
                n["NodeID"]
                for n in alive
                if n["NodeID"] not in used and all(n["Resources"].get(k, 0.0) >= v for k, v in need.items())
            ]
            choice = fits[0] if fits else None
            if choice:
                used.add(choice)
            targets.append(choice)
        return targets

    def placement_groups(self) -> list[PlacementGroup]:
        """Create (once) and return the placement groups, waiting until they are reserved.

        Groups that Ray put on the same node come out next to each other (in the order they were asked
        for otherwise), so that the ranks of each node are consecutive.
        """
        if self._placement_groups is not None:
            return self._placement_groups
        groups = []
        for index, (count, target) in enumerate(zip(self.process_on_nodes, self._target_nodes())):
            groups.append(
                placement_group(
                    [self._bundle() for _ in range(count)],
                    strategy="STRICT_PACK",
                    name=f"{self.name_prefix}pool_{index}" if self.name_prefix else "",
                    lifetime="detached" if self.detached else None,
                    _soft_target_node_id=target,
                )
            )
        deadline = time.monotonic() + PG_READY_TIMEOUT_S
        for index, pg in enumerate(groups):
            try:
                ray.get(pg.ready(), timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                for g in groups:
                    remove_placement_group(g)
                raise RuntimeError(
                    f"could not reserve {self.process_on_nodes[index]} x {self._bundle()} on one node (pool node "
                    f"{index}) within {PG_READY_TIMEOUT_S:.0f}s; alive nodes and their resources: "
                    f"{_alive_node_resources()}; available now: {ray.available_resources()}. Use fewer processes "
                    "per node, fewer cpus_per_process, use_gpu=False, or add nodes."
                ) from None
        nodes = [_node_of(pg) for pg in groups]
        order = sorted(range(len(groups)), key=lambda i: nodes.index(nodes[i]))
        self._placement_groups = [groups[i] for i in order]
        self._group_counts = [self.process_on_nodes[i] for i in order]
        self._group_nodes = [nodes[i] for i in order]
        if not self.detached:
            # Ray keeps a placement group until it is removed or the job ends: a pool that nothing uses any more (its
            # worker groups hold it) gives its reservation back, as its actors end when their handles are dropped.
            self._remove_when_dropped = weakref.finalize(
                self, remove_after_closing, list(self._placement_groups), self.closing_calls, CLOSE_WAIT_S
            )
            self._remove_when_dropped.atexit = False  # the job's end removes them, after ray.shutdown may have run
        return self._placement_groups

    def node_ids(self) -> list[str]:
        """The Ray node of each placement group, in rank order (equal ids: Ray packed them on one node)."""
        self.placement_groups()
        return list(self._group_nodes)

    def rank_slots(self) -> list[RankSlot]:
        """One slot per rank: ranks fill the placement groups in order, so a node's ranks are consecutive."""
        groups = self.placement_groups()
        ranks_on_node: dict[str, int] = {}
        for count, node in zip(self._group_counts, self._group_nodes):
            ranks_on_node[node] = ranks_on_node.get(node, 0) + count
        seen: dict[str, int] = {}
        slots = []
        for pg, count, node in zip(groups, self._group_counts, self._group_nodes):
            for bundle in range(count):
                local_rank = seen.get(node, 0)
                seen[node] = local_rank + 1
                slots.append(RankSlot(pg, bundle, local_rank, ranks_on_node[node], node))
        return slots

    def release(self) -> None:
        """Give the reserved resources back (actors placed in them are killed by Ray)."""
        if self._remove_when_dropped is not None:
            self._remove_when_dropped.detach()
            self._remove_when_dropped = None
        for pg in self._placement_groups or []:
            remove_placement_group(pg)
        self._placement_groups = None
        self._group_counts, self._group_nodes = [], []


def _node_of(pg: PlacementGroup) -> str:
    """The node a reserved STRICT_PACK placement group lives on (all its bundles share it)."""
    return placement_group_table(pg)["bundles_to_node_id"][0]


def alive_nodes() -> list[dict[str, Any]]:
    """The `ray.nodes()` rows of the nodes alive now (Ray keeps dead ones listed)."""
    return [node for node in ray.nodes() if node.get("Alive")]


def _alive_node_resources() -> list[str]:
    return [
        f"{n['NodeManagerAddress']} (node {n['NodeID'][:12]}): {n['Resources'].get('CPU', 0):g} CPU, "
        f"{n['Resources'].get('GPU', 0):g} GPU"
        for n in alive_nodes()
    ]
