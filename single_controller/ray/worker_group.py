"""`RayWorkerGroup`: one Ray actor per rank, with every registered method bound as a driver method."""

from __future__ import annotations

import functools
import time
import uuid
import weakref
from typing import Any, Callable, Iterable, Mapping

import ray
from ray.experimental import internal_kv
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.call_timing import record_async_call, record_driver_call
from single_controller.decorator import Execute, MethodSpec, get_method_spec
from single_controller.dispatch import DispatchEntry, resolve_dispatch
from single_controller.dispatch_result import per_rank_arguments
from single_controller.errors import WorkerGroupError
from single_controller.mesh import MeshPlacement, complete_placements
from single_controller.ray.actor_env import actor_runtime_env, check_user_env, rank_env
from single_controller.ray.call_log import CallLog
from single_controller.ray.class_with_args import RayClassWithInitArgs, plain_class
from single_controller.ray.colocated import FUSED_EXECUTE_METHOD, ColocatedWorker, role_method_name
from single_controller.ray.placement import describe_placement, preset_master_addr
from single_controller.ray.resource_pool import RayResourcePool
from single_controller.ray.shared_objects import SharedObjects
from single_controller.ray.waiting import unfinished_ranks, wait_for_outputs
from single_controller.ray.worker_lifetime import WorkerLifetime
from single_controller.shards import JoinablePart
from single_controller.worker import (
    ENV_MASTER_ADDR,
    ENV_MASTER_RENDEZVOUS,
    ENV_RESERVE_MASTER_PORT,
    MASTER_WAIT_TIMEOUT_S,
    RENDEZVOUS_NAMESPACE,
    NodeInfo,
    Worker,
)

DETACHED_NAMESPACE = "single_controller"
INIT_TIMEOUT_S = MASTER_WAIT_TIMEOUT_S  # one bound on a rank's start, driver and worker side


def _actor_name(name_prefix: str, rank: int) -> str:
    return f"{name_prefix}_{rank}"


class RayWorkerGroup:
    """A group of `world_size` workers of one class, placed on a resource pool.

    Every method of the worker class decorated with `@register` becomes a method of the group: calling it
    splits the arguments with the method's dispatch mode, runs it on the ranks its execute mode names, and
    collects the outputs (or returns a `DataProtoFuture` when registered with `blocking=False`).
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
            self._create_workers(resource_pool, ray_cls_with_init, user_env, self._rendezvous)
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
            self._wait_for_rank0(self._workers[0])
            self._node_info = self._fetch_node_info()
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
        group._node_info = node_info if node_info is not None else group._fetch_node_info()
        group._bind_registered_methods(worker_cls)
        return group

    @classmethod
    def from_detached(
        cls, name_prefix: str, worker_cls: Any, call_timeout_s: float | None = None
    ) -> "RayWorkerGroup":
        """Attach to a detached group created (by any driver) with `detached=True, name_prefix=...`."""
        worker_cls = plain_class(worker_cls.cls if isinstance(worker_cls, RayClassWithInitArgs) else worker_cls)
        try:
            rank0 = ray.get_actor(_actor_name(name_prefix, 0), namespace=DETACHED_NAMESPACE)
        except ValueError:
            raise LookupError(
                f"no detached worker group named {name_prefix!r} is alive (looked for actor "
                f"{_actor_name(name_prefix, 0)!r} in namespace {DETACHED_NAMESPACE!r})"
            ) from None
        world_size = ray.get(rank0.sc_world_size.remote())
        workers = [rank0] + [
            ray.get_actor(_actor_name(name_prefix, r), namespace=DETACHED_NAMESPACE) for r in range(1, world_size)
        ]
        group = cls._from_handles(name_prefix, workers, worker_cls, call_timeout_s=call_timeout_s)
        group.detached = True
        return group

    def _create_workers(
        self, pool: RayResourcePool, cia: RayClassWithInitArgs, user_env: dict[str, str], rendezvous: str
    ) -> None:
        """Requests every rank at once into `self._workers` (their imports overlap; after a failure part-way
        the ranks already requested are there to kill); rank 0 publishes its master address under
        `rendezvous` and the other ranks read it before their `__init__` (see `Worker.__new__`)."""
        remote_cls = ray.remote(cia.cls)
        slots = pool.rank_slots()
        world_size = len(slots)
        master_host = preset_master_addr([slot.node_id for slot in slots])
        user_runtime_env = dict(cia.actor_options.get("runtime_env") or {})
        check_user_env(
            user_runtime_env.get("env_vars"), "runtime_env['env_vars'] of RayClassWithInitArgs.update_options"
        )
        for rank, slot in enumerate(slots):
            env = rank_env(rank, world_size, slot, self.name)
            env[ENV_MASTER_RENDEZVOUS] = rendezvous
            if rank == 0:
                env[ENV_RESERVE_MASTER_PORT] = "1"
                if master_host is not None:
                    env[ENV_MASTER_ADDR] = master_host
            options: dict[str, Any] = {**pool.actor_resources(), **cia.actor_options}
            options.update(
                runtime_env=actor_runtime_env(user_runtime_env, user_env, env),
                scheduling_strategy=PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
            )
            if self.detached:
                options.update(
                    name=_actor_name(self.name, rank), namespace=DETACHED_NAMESPACE, lifetime="detached"
                )
            self._workers.append(remote_cls.options(**options).remote(*cia.args, **cia.kwargs))

    def _wait_for_rank0(self, rank0: Any) -> None:
        """Returns once rank 0 has finished __init__; raises an error naming rank 0 if it failed or hung."""
        try:
            ray.get(rank0.sc_master_address.remote(), timeout=INIT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise WorkerGroupError(
                self.name, "__init__", [0],
                f"rank 0 did not finish __init__ within {INIT_TIMEOUT_S:.0f}s",
            ) from None
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            raise WorkerGroupError(self.name, "__init__", [0], f"rank 0 failed to start:\n{error}") from None

    def _fetch_node_info(self) -> list[NodeInfo]:
        refs = [w.sc_node_info.remote() for w in self._workers]
        return wait_for_outputs(
            refs, list(range(len(refs))), self.name, "__init__", lambda r: f"rank {r}", INIT_TIMEOUT_S
        )

    def _bind_registered_methods(self, worker_cls: type) -> None:
        for attr in dir(worker_cls):
            spec = get_method_spec(getattr(worker_cls, attr, None))
            if spec is None:
                continue
            if hasattr(type(self), attr):
                raise ValueError(
                    f"registered method {worker_cls.__name__}.{attr} has the name of a RayWorkerGroup attribute; "
                    "rename the method"
                )
            setattr(self, attr, self._make_driver_method(attr, spec))

    def _make_driver_method(self, method: str, spec: MethodSpec) -> Callable[..., Any]:
        entry = resolve_dispatch(spec.dispatch_mode)
        # Stored on the group, a method holding the group itself would make a reference cycle: a dropped group (and
        # its actors, GPUs and placement) would then live on until Python's cyclic collector happened to run.
        group_ref = weakref.ref(self)
        group_name = self.name

        def driver_method(*args: Any, **kwargs: Any) -> Any:
            group = group_ref()
            if group is None:
                raise ReferenceError(
                    f"{group_name}.{method} was called after its RayWorkerGroup was dropped (no reference to the "
                    "group was left, so Ray ended its workers); keep the group, not only its method"
                )
            return group._call(method, entry, spec.execute_mode, spec.blocking, args, kwargs)

        driver_method.__name__ = method
        return driver_method

    # ---- calling ---------------------------------------------------------------------------------------
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

    def _record(self, rank: int, method: str) -> None:
        self._call_log.record(rank, f"{self.name}.{method}")

    def mesh_placements(self, mesh_name: str) -> list[MeshPlacement]:
        """Each rank's place in the mesh it declared at run time (queried once, then cached)."""
        if mesh_name not in self._mesh_cache:
            refs = [getattr(w, self._method_prefix + "sc_mesh_placement").remote(mesh_name) for w in self._workers]
            placements = self._wait(refs, list(range(self.world_size)), "sc_mesh_placement")
            self._mesh_cache[mesh_name] = complete_placements(placements, mesh_name)
        return self._mesh_cache[mesh_name]

    def _wait(
        self, refs: list[ray.ObjectRef], ranks: list[int], method: str, on_ready: Callable[[], None] | None = None
    ) -> list[Any]:
        return wait_for_outputs(
            refs, ranks, self.name, method, self.describe_rank, self.call_timeout_s, recent_calls=self._call_log.recent,
            on_ready=on_ready, node_info=self._node_info,
        )

    def _call(
        self, method: str, entry: DispatchEntry, execute: Execute, blocking: bool, args: tuple, kwargs: dict
    ) -> Any:
        from protocol import DataProtoFuture

        started = time.perf_counter()
        per_rank_args, per_rank_kwargs = per_rank_arguments(
            entry.dispatch_fn(self, *args, **kwargs),
            self.world_size,
            f"{self.name}.{method}",
            entry.dispatch_fn,
            args,
            kwargs,
        )
        ranks = list(range(self.world_size)) if execute == Execute.ALL else [0]
        refs = self._submit(method, ranks, per_rank_args, per_rank_kwargs)

        def collect(outputs: list[Any]) -> Any:
            if not entry.joins_parts:
                outputs = [o.value if isinstance(o, JoinablePart) else o for o in outputs]
            return entry.collect_fn(self, outputs)

        chunk_refs = entry.chunk_refs(self, refs) if entry.chunk_refs is not None and execute == Execute.ALL else None
        fetch: Callable[[list[ray.ObjectRef]], Any] = functools.partial(self._wait, ranks=ranks, method=method)
        if not blocking:
            fetch, collect = self._timed_async_get(method, ranks, time.perf_counter() - started, collect)
        future = DataProtoFuture(
            refs, collect_fn=collect, fetch_fn=fetch, chunk_refs=chunk_refs, description=f"{self.name}.{method}"
        )
        if not blocking:
            return future
        output = future.get()
        record_driver_call(self.name, method, ranks, started)
        return output

    def _timed_async_get(
        self, method: str, ranks: list[int], submit_s: float, collect: Callable[[list[Any]], Any]
    ) -> tuple[Callable[[list[ray.ObjectRef]], Any], Callable[[Any], Any]]:
        """Fetch and collect functions of a non-blocking call that record it (see `record_async_call`) when
        its result is fetched: the time until every rank finished counts as waiting for the workers, the
        rest (submission, transfer, collect) as the call's own cost."""

        def fetch(refs: list[ray.ObjectRef]) -> tuple[list[Any], float, float]:
            started = time.perf_counter()
            ready = [started]
            outputs = self._wait(refs, ranks, method, on_ready=lambda: ready.__setitem__(0, time.perf_counter()))
            return outputs, started, ready[0]

        def timed_collect(fetched: tuple[list[Any], float, float]) -> Any:
            outputs, started, ready = fetched
            result = collect(outputs)
            record_async_call(self.name, method, ranks, submit_s + time.perf_counter() - started, ready - started)
            return result

        return fetch, timed_collect

    def _submit(self, method: str, ranks: list[int], args: tuple, kwargs: dict) -> list[ray.ObjectRef]:
        shared = SharedObjects()
        refs = []
        for rank in ranks:
            rank_args = [shared.place(a[rank], a) for a in args]
            rank_kwargs = {k: shared.place(v[rank], v) for k, v in kwargs.items()}
            self._record(rank, method)
            refs.append(getattr(self._workers[rank], self._method_prefix + method).remote(*rank_args, **rank_kwargs))
        return refs

    # ---- generic execution (verl-style helpers) ---------------------------------------------------------
    def _per_rank_call(self, method: str, ranks: list[int], args: tuple, kwargs: dict) -> list[ray.ObjectRef]:
        """Call `method` on `ranks`. If every argument is a list of world_size entries, rank r gets entry r
        of each; otherwise every rank gets the arguments as they are."""
        n = self.world_size
        values = [*args, *kwargs.values()]
        split = bool(values) and all(isinstance(v, list) and len(v) == n for v in values)
        refs = []
        for rank in ranks:
            self._record(rank, method)
            rank_args = [a[rank] for a in args] if split else args
            rank_kwargs = {k: v[rank] for k, v in kwargs.items()} if split else kwargs
            refs.append(getattr(self._workers[rank], self._method_prefix + method).remote(*rank_args, **rank_kwargs))
        return refs

    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call `method` on every rank and return the ObjectRefs (see _per_rank_call for list arguments)."""
        return self._per_rank_call(method, list(range(self.world_size)), args, kwargs)

    def execute_all_sync(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call `method` on every rank and wait: one result per rank (errors name the failing ranks)."""
        return self._wait(self.execute_all_async(method, *args, **kwargs), list(range(self.world_size)), method)

    execute_all = execute_all_sync  # waits and returns the results (not ObjectRefs)

    def execute_rank_zero_async(self, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Call `method` on rank 0 only and return its ObjectRef."""
        self._record(0, method)
        return getattr(self._workers[0], self._method_prefix + method).remote(*args, **kwargs)

    def execute_rank_zero_sync(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on rank 0 only and wait for its result."""
        return self._wait([self.execute_rank_zero_async(method, *args, **kwargs)], [0], method)[0]

    execute_rank_zero = execute_rank_zero_sync  # waits and returns the result (not an ObjectRef)

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
