"""`Worker`: the base class of everything a worker group runs; knows its rank and sets up torch.distributed."""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

from single_controller.call_timing import MAX_RECORDS
from single_controller.decorator import register
from single_controller.errors import DispatchError, MeshNotDeclaredError
from single_controller.mesh import MeshPlacement, placement_from_axes
from single_controller.modes import Dispatch

# Environment variables the worker group sets on each actor (read by torch.distributed's env:// init).
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
# Set by the worker group on rank 0 only: reserve a master port in this process and report it.
ENV_RESERVE_MASTER_PORT = "SINGLE_CONTROLLER_RESERVE_MASTER_PORT"
# The key in Ray's key-value store under which rank 0 publishes its master address; the other ranks, started
# at the same time, read it there before their __init__ runs.
ENV_MASTER_RENDEZVOUS = "SINGLE_CONTROLLER_MASTER_RENDEZVOUS"
ENV_GROUP_NAME = "SINGLE_CONTROLLER_GROUP_NAME"
RENDEZVOUS_NAMESPACE = "single_controller_rendezvous"
MASTER_WAIT_TIMEOUT_S = 180.0

# The reserved socket stays open for the life of the process: it is bound with SO_REUSEADDR but never
# listens, so torch's TCPStore (which also sets SO_REUSEADDR) can bind the same port, while no other
# process on the node can be handed that port in the meantime. This is what makes the choice race-free.
_reserved_master_socket: socket.socket | None = None


def node_ip_address() -> str:
    """The address other processes of this Ray cluster reach this node on."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def _reserve_master_port() -> None:
    global _reserved_master_socket
    if _reserved_master_socket is not None or os.environ.get(ENV_MASTER_PORT):
        return
    # The worker group presets MASTER_ADDR to loopback when all ranks share a node.
    address = os.environ.get(ENV_MASTER_ADDR) or node_ip_address()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    _reserved_master_socket = sock
    os.environ[ENV_MASTER_ADDR] = address
    os.environ[ENV_MASTER_PORT] = str(sock.getsockname()[1])


def _publish_master_address(key: str) -> None:
    from ray.experimental import internal_kv

    address = f"{os.environ[ENV_MASTER_ADDR]}:{os.environ[ENV_MASTER_PORT]}"
    internal_kv._internal_kv_put(key, address, namespace=RENDEZVOUS_NAMESPACE)


def _await_master_address(key: str) -> None:
    """Blocks until rank 0 has published its master address, then sets it in this process's environment."""
    from ray.experimental import internal_kv

    deadline = time.monotonic() + MASTER_WAIT_TIMEOUT_S
    pause = 0.01
    while (value := internal_kv._internal_kv_get(key, namespace=RENDEZVOUS_NAMESPACE)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"rank {os.environ.get(ENV_RANK)} of worker group {os.environ.get(ENV_GROUP_NAME)!r}: rank 0 did not "
                f"report its master address within {MASTER_WAIT_TIMEOUT_S:.0f}s (did rank 0 fail to start?)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
    address, port = value.decode().rsplit(":", 1)
    os.environ[ENV_MASTER_ADDR], os.environ[ENV_MASTER_PORT] = address, port


@dataclass(frozen=True)
class NodeInfo:
    """Where a worker runs, reported to the driver for placement checks and error messages."""

    rank: int
    node_id: str
    ip: str
    pid: int
    gpu_ids: tuple[str, ...]


def init_default_process_group(backend: str | None = None, **kwargs: Any) -> None:
    """Join the worker group's default process group, with the rank, world size and master address the group set in
    the environment (also from code that has no `Worker` at hand: the strategy API); nccl when a GPU is visible,
    gloo otherwise. A no-op when joined."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get(ENV_LOCAL_RANK, "0")) if torch.cuda.device_count() > 1 else 0)
    rank, world_size = int(os.environ.get(ENV_RANK, "0")), int(os.environ.get(ENV_WORLD_SIZE, "1"))
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)


class Worker:
    """Base class for worker-group members.

    Rank, world size, local rank and the master address come from the environment the worker group sets,
    so they are valid in `__init__` already. The ranks start together: rank 0 reserves a master port before
    its `__init__` and the others wait for it before theirs. Calling `torch.distributed.init_process_group()`
    (or `self.init_process_group()`) in a registered method such as `init_model` keeps `__init__` quick.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Worker":
        instance = super().__new__(cls)
        instance._declared_meshes: dict[str, MeshPlacement] = {}
        # The roles of a fused (colocated) actor, by name; filled by ColocatedWorker, empty otherwise.
        instance.fused_worker_dict: dict[str, Worker] = {}
        # (method, seconds inside it) per registered call, popped by the driver to measure overhead
        instance._sc_exec_seconds = deque(maxlen=MAX_RECORDS)
        instance._sc_closed = False  # `close` runs once: from RayWorkerGroup.close, or when Ray ends the actor
        rendezvous = os.environ.get(ENV_MASTER_RENDEZVOUS)
        if os.environ.get(ENV_RESERVE_MASTER_PORT) == "1" and int(os.environ.get(ENV_RANK, "0")) == 0:
            _reserve_master_port()
            if rendezvous:
                _publish_master_address(rendezvous)
        elif rendezvous and not os.environ.get(ENV_MASTER_PORT):
            _await_master_address(rendezvous)
        return instance

    # ---- identity --------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(os.environ.get(ENV_RANK, "0"))

    @property
    def world_size(self) -> int:
        return int(os.environ.get(ENV_WORLD_SIZE, "1"))

    @property
    def local_rank(self) -> int:
        return int(os.environ.get(ENV_LOCAL_RANK, "0"))

    @property
    def local_world_size(self) -> int:
        return int(os.environ.get(ENV_LOCAL_WORLD_SIZE, "1"))

    @property
    def group_name(self) -> str:
        return os.environ.get(ENV_GROUP_NAME, "")

    # ---- torch.distributed ------------------------------------------------------------------------------
    def init_process_group(self, backend: str | None = None, **kwargs: Any) -> None:
        """Join the group's default process group: nccl when a GPU is visible, gloo otherwise."""
        init_default_process_group(backend, **kwargs)

    # ---- meshes -----------------------------------------------------------------------------------------
    def declare_mesh(
        self,
        name: str,
        shape: Mapping[str, int],
        dp_axis: str = "dp",
        collect_from: Mapping[str, int] | None = None,
    ) -> MeshPlacement:
        """Declare this rank's place in a named mesh (e.g. {"pp": 2, "dp": 2, "tp": 2}, row-major).

        Methods registered with `MeshDispatch(name)` then split data over `dp_axis` only and collect one
        output per DP group (see `placement_from_axes` for `collect_from`).
        """
        import math

        if math.prod(shape.values()) != self.world_size:
            raise ValueError(
                f"mesh {name!r} with axes {dict(shape)} has {math.prod(shape.values())} ranks but the group has "
                f"{self.world_size} workers"
            )
        placement = placement_from_axes(self.rank, shape, dp_axis, collect_from)
        self._declared_meshes[name] = placement
        return placement

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Register this rank's DP rank in `mesh_name` and whether its output is collected.

        The lower-level form of `declare_mesh`: the group derives the DP size (max DP rank + 1) and checks
        that each DP rank has exactly one collecting rank. Use with `make_nd_compute_dataproto_dispatch_fn`
        or `MeshDispatch(mesh_name)`.
        """
        if mesh_name in self._declared_meshes:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
            raise ValueError(f"dp_rank must be a non-negative int, got {dp_rank!r}")
        self._declared_meshes[mesh_name] = MeshPlacement(dp_rank=dp_rank, dp_size=None, is_collector=bool(is_collect))

    @register(Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This rank's DP rank in `mesh_name` (through the group: one per rank)."""
        return self.sc_mesh_placement(mesh_name).dp_rank

    @register(Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's output is collected in `mesh_name` (through the group: one per rank)."""
        return self.query_collect_info(mesh_name)

    def query_collect_info(self, mesh_name: str) -> bool:
        return self.sc_mesh_placement(mesh_name).is_collector

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """Every mesh this rank registered: `{"dispatch_dp_rank": {mesh: dp_rank}, "collect_dp_rank": {mesh: bool}}`."""
        meshes = self._declared_meshes
        return {
            "dispatch_dp_rank": {name: p.dp_rank for name, p in meshes.items()},
            "collect_dp_rank": {name: p.is_collector for name, p in meshes.items()},
        }

    def set_dispatch_collect(
        self, mesh_name: str, dispatch_dp_rank: Mapping[str, int], collect_dp_rank: Mapping[str, bool]
    ) -> None:
        """Register `mesh_name` with the DP rank and collect flag another worker registered, as verl's outer
        workers do with an inner engine's meshes: `self.set_dispatch_collect("actor", **inner.get_dispatch_collect())`.

        The dicts come from `get_dispatch_collect`; they must name at least one mesh, and every mesh in them must
        agree (verl silently takes the last one).
        """
        ranks, flags = set(dispatch_dp_rank.values()), set(collect_dp_rank.values())
        if len(ranks) != 1 or len(flags) != 1:
            raise DispatchError(
                f"set_dispatch_collect({mesh_name!r}) needs one DP rank and one collect flag; got dispatch_dp_rank="
                f"{dict(dispatch_dp_rank)} and collect_dp_rank={dict(collect_dp_rank)} (pass what "
                "get_dispatch_collect() of a worker that registered its mesh returns)"
            )
        if mesh_name in self._declared_meshes:
            raise DispatchError(
                f"mesh {mesh_name!r} is already registered on rank {self.rank}: {sorted(self._declared_meshes)}"
            )
        self._register_dispatch_collect_info(mesh_name, dp_rank=ranks.pop(), is_collect=flags.pop())

    def get_fused_worker_by_name(self, worker_name: str) -> "Worker | None":
        """Another role of the same fused actor (see create_colocated_worker_raw_cls), or None."""
        return self.fused_worker_dict.get(worker_name)

    # ---- queried by the worker group (plain actor methods, not registered) ------------------------------
    def sc_master_address(self) -> tuple[str, int]:
        return os.environ[ENV_MASTER_ADDR], int(os.environ[ENV_MASTER_PORT])

    def sc_node_info(self) -> NodeInfo:
        import ray

        context = ray.get_runtime_context()
        gpu_ids = tuple(str(g) for g in ray.get_gpu_ids()) if ray.is_initialized() else ()
        return NodeInfo(self.rank, context.get_node_id(), node_ip_address(), os.getpid(), gpu_ids)

    def sc_mesh_placement(self, name: str) -> MeshPlacement:
        meshes = self._declared_meshes
        if name not in meshes:
            raise MeshNotDeclaredError(
                f"rank {self.rank} has not declared mesh {name!r} (declared: {sorted(meshes)}); call "
                f"self.declare_mesh({name!r}, shape) (or self._register_dispatch_collect_info({name!r}, dp_rank, "
                "is_collect)) in a method that runs before this one, e.g. init_model"
            )
        return meshes[name]

    def sc_world_size(self) -> int:
        return self.world_size

    def close(self) -> None:
        """Free what this worker holds outside its own memory (shared memory, processes it started) before its group
        kills it: `RayWorkerGroup.close` calls it on every rank at the end of a run. Nothing by default."""

    def sc_close(self) -> None:
        """`close` of this worker, or of each role of a fused (colocated) actor; once."""
        if self._sc_closed:
            return
        self._sc_closed = True
        for worker in self.fused_worker_dict.values() or [self]:
            worker.close()

    def __ray_shutdown__(self) -> None:
        """Ray's hook when it ends the actor gently: every handle to it was dropped (e.g. its group was dropped
        without `kill`). The same `close` as `RayWorkerGroup.close`, so what the worker holds outside its memory
        does not outlive it."""
        self.sc_close()

    def sc_pop_exec_seconds(self) -> list[tuple[str, float]]:
        """`(method, seconds)` of the registered calls since the last pop, in order."""
        records = list(self._sc_exec_seconds)
        self._sc_exec_seconds.clear()
        return records
