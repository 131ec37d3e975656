"""`RayWorkerGroup`: one Ray actor per rank, with every registered method bound as a driver method."""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Mapping

import ray
from ray.experimental import internal_kv

from single_controller.mesh import MeshPlacement
from single_controller.ray.actor_env import check_user_env
from single_controller.ray.call_log import CallLog
from single_controller.ray.class_with_args import RayClassWithInitArgs, plain_class
from single_controller.ray.colocated import FUSED_EXECUTE_METHOD, ColocatedWorker, role_method_name
from single_controller.ray.group_calls import GroupCalls
from single_controller.ray.placement import describe_placement
from single_controller.ray.rank_actors import fetch_node_info, find_detached_actors, request_rank_actors, wait_for_rank0
from single_controller.ray.resource_pool import RayResourcePool
from single_controller.ray.waiting import unfinished_ranks
from single_controller.ray.worker_lifetime import WorkerLifetime
from single_controller.worker import RENDEZVOUS_NAMESPACE, NodeInfo, Worker


class RayWorkerGroup(GroupCalls):
    """A group of `world_size` workers of one class, placed on a resource pool.

    Every method of the worker class decorated with `@register` becomes a method of the group: calling it
    splits the arguments with the method's dispatch mode, runs it on the ranks its execute mode names, and
    collects the outputs (or returns a `DataProtoFuture` when registered with `blocking=False`).
    Calling is the `GroupCalls` mixin's (group_calls.py); the actors are made by rank_actors.py.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        call_timeout_s: float | None = None,
        worker_env: Mapping[str, str] | None = None,
        wait_started: bool = True,
    ) -> None:
        """`worker_env`: extra environment variables for every worker (verl's keyword; see actor_env.py).
        `wait_started=False` returns once the actors are requested, so that several groups start side by
        side; call `wait_started()` on each before using it."""
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init=RayClassWithInitArgs(WorkerClass, ...)")
        if resource_pool is None:
            raise ValueError(
                "RayWorkerGroup needs a resource_pool to create workers; to attach to a detached group "
                "use RayWorkerGroup.from_detached(name_prefix, worker_class)"
            )
        if not issubclass(ray_cls_with_init.cls, Worker):
            raise TypeError(
                f"{ray_cls_with_init.cls.__qualname__} must subclass single_controller.Worker to run in a worker group"
            )
        self.name = name_prefix or f"{ray_cls_with_init.cls.__name__}_{uuid.uuid4().hex[:8]}"
        self.detached = detached
        self.call_timeout_s = call_timeout_s
        self._method_prefix = ""
        self._mesh_cache: dict[str, list[MeshPlacement]] = {}
        if detached and not resource_pool.detached:
            raise ValueError(
                "a detached worker group must live on a detached pool (RayResourcePool(..., detached=True)), "
                "otherwise its placement groups vanish with this driver"
            )
        self.worker_class = ray_cls_with_init.cls
        user_env = check_user_env(worker_env, "worker_env")
        self._rendezvous: str | None = f"{self.name}/{uuid.uuid4().hex}"
        self._workers: list[Any] = []
        self._node_info: list[NodeInfo] = []
        try:
            request_rank_actors(
                self._workers, self.name, resource_pool, ray_cls_with_init, user_env, self._rendezvous, detached
            )
        except BaseException:
            self._abandon_start()
            raise
        self._call_log = CallLog(len(self._workers))
        self._lifetime = WorkerLifetime(self._workers, resource_pool, close_when_dropped=not detached)
        self._bind_registered_methods(ray_cls_with_init.cls)
        if wait_started:
            self.wait_started()

    def wait_started(self) -> "RayWorkerGroup":
        """Waits until every rank has finished `__init__` (at once if it already has); returns the group."""
        if self._rendezvous is None:
            return self
        try:
            wait_for_rank0(self.name, self._workers[0])
            self._node_info = fetch_node_info(self.name, self._workers)
        except BaseException:
            self._abandon_start()
            raise
        self._forget_rendezvous()
        return self

    def _abandon_start(self) -> None:
        self.kill()  # ranks that did start would otherwise wait for rank 0 or hold their resources
        self._forget_rendezvous()

    def _forget_rendezvous(self) -> None:
        if self._rendezvous is not None:
            internal_kv._internal_kv_del(self._rendezvous, namespace=RENDEZVOUS_NAMESPACE)
        self._rendezvous = None

    # ---- construction ----------------------------------------------------------------------------------
    @classmethod
    def _from_handles(
        cls,
        name: str,
        workers: list[Any],
        worker_cls: type,
        method_prefix: str = "",
        node_info: list[NodeInfo] | None = None,
        call_timeout_s: float | None = None,
        call_log: CallLog | None = None,
        lifetime: WorkerLifetime | None = None,
    ) -> "RayWorkerGroup":
        group = cls.__new__(cls)
        group.name, group.detached, group.call_timeout_s = name, False, call_timeout_s
        group._method_prefix = method_prefix
        group.worker_class = worker_cls
        group._mesh_cache = {}
        group._workers = list(workers)
        # a role's view shares the lifetime of the group it came from; an attached detached group has none
        group._lifetime = lifetime if lifetime is not None else WorkerLifetime(group._workers, None, False)
        group._rendezvous = None  # started already
        group._call_log = call_log if call_log is not None else CallLog(len(group._workers))
        group._node_info = node_info if node_info is not None else fetch_node_info(name, group._workers)
        group._bind_registered_methods(worker_cls)
        return group

    @classmethod
    def from_detached(
        cls, name_prefix: str, worker_cls: Any, call_timeout_s: float | None = None
    ) -> "RayWorkerGroup":
        """Attach to a detached group created (by any driver) with `detached=True, name_prefix=...`."""
        worker_cls = plain_class(worker_cls.cls if isinstance(worker_cls, RayClassWithInitArgs) else worker_cls)
        workers = find_detached_actors(name_prefix)
        group = cls._from_handles(name_prefix, workers, worker_cls, call_timeout_s=call_timeout_s)
        group.detached = True
        return group

    # ---- state -----------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list[Any]:
        return list(self._workers)

    @property
    def node_info(self) -> list[NodeInfo]:
        return list(self._node_info)

    @property
    def call_log(self) -> CallLog:
        return self._call_log

    def describe_placement(self) -> str:
        """Which ranks run on which node: 'ranks 0-1 on node 3a457eb4c2f1 (10.0.0.1), ranks 2-3 on ...'."""
        return describe_placement(self._node_info)

    def describe_rank(self, rank: int) -> str:
        info = self._node_info[rank] if rank < len(self._node_info) else None
        where = f" (node {info.node_id[:12]} {info.ip}, pid {info.pid})" if info else ""
        return f"rank {rank}{where}"

    # The actor method that calls any method of one role of a fused actor: "<role>_fwmn_<method>".
    fused_worker_execute_fn_name = FUSED_EXECUTE_METHOD

    def spawn(self, prefix_set: Iterable[str] | None = None) -> dict[str, "RayWorkerGroup"]:
        """Per-role views of a group made from `create_colocated_worker_cls` (all roles by default)."""
        return spawn_roles(self, prefix_set)

    def fuse(self, prefix_set: Iterable[str] | None = None) -> None:
        """Attach each role's view as an attribute: `group.fuse(); group.actor.update(data)`."""
        for role, view in self.spawn(prefix_set).items():
            if role in vars(self) or hasattr(type(self), role):
                raise ValueError(f"cannot fuse role {role!r}: the group already has an attribute of that name")
            setattr(self, role, view)

    # ---- lifetime --------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 60.0) -> list[int]:
        """Every rank's `Worker.close` (what a rank holds outside its memory, e.g. an engine's shared memory and
        processes), before `kill`, which runs no code in the workers. Waits at most `timeout_s`; returns the ranks
        that did not finish (busy, failed or gone): those are killed as they are."""
        return unfinished_ranks([worker.sc_close.remote() for worker in self._workers], timeout_s)

    def kill(self) -> None:
        """Kill every actor of the group (needed for detached groups, which outlive their driver)."""
        for worker in self._workers:
            try:
                ray.kill(worker, no_restart=True)
            except ValueError:  # not an actor handle of this cluster any more
                pass

    def __repr__(self) -> str:
        return f"RayWorkerGroup({self.name!r}, world_size={self.world_size})"


def spawn_roles(group: RayWorkerGroup, roles: Iterable[str] | None = None) -> dict[str, RayWorkerGroup]:
    """Per-role views of a colocated group: same actors, each role's registered methods unprefixed."""
    worker_cls = group.worker_class
    if not issubclass(worker_cls, ColocatedWorker):
        raise TypeError(f"group {group.name!r} was not made from create_colocated_worker_cls")
    role_classes = worker_cls.role_classes
    wanted = list(role_classes) if roles is None else list(roles)
    unknown = sorted(set(wanted) - set(role_classes))
    if unknown:
        raise ValueError(f"unknown roles {unknown}; this colocated group has {sorted(role_classes)}")
    return {
        role: RayWorkerGroup._from_handles(
            f"{group.name}.{role}",
            group.workers,
            role_classes[role].cls,
            method_prefix=role_method_name(role, ""),
            node_info=group.node_info,
            call_timeout_s=group.call_timeout_s,
            call_log=group.call_log,  # the roles share actors, so they share what was last sent to them
            lifetime=group._lifetime,
        )
        for role in wanted
    }
