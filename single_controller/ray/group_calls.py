"""Calling a worker group's ranks: each `@register`ed method bound as a driver method (dispatch, submit,
wait, collect), and verl's generic `execute_*` helpers.

They live in a mixin below `worker_group.py` so that file keeps the group itself (start, views, lifetime).
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

import ray

from single_controller.call_timing import record_async_call, record_driver_call
from single_controller.decorator import Execute, MethodSpec, get_method_spec
from single_controller.dispatch import DispatchEntry, resolve_dispatch
from single_controller.dispatch_result import per_rank_arguments
from single_controller.mesh import MeshPlacement, complete_placements
from single_controller.ray.call_log import CallLog
from single_controller.ray.shared_objects import SharedObjects
from single_controller.ray.waiting import wait_for_outputs
from single_controller.shards import JoinablePart
from single_controller.worker import NodeInfo


class GroupCalls:
    """Mixed into RayWorkerGroup, which provides the fields and the members declared below."""

    name: str
    call_timeout_s: float | None
    _method_prefix: str
    _workers: list[Any]
    _node_info: list[NodeInfo]
    _call_log: CallLog
    _mesh_cache: dict[str, list[MeshPlacement]]

    if TYPE_CHECKING:  # defined on RayWorkerGroup; stubs here would shadow them at run time

        @property
        def world_size(self) -> int: ...
        def describe_rank(self, rank: int) -> str: ...

    # ---- binding ---------------------------------------------------------------------------------------
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
