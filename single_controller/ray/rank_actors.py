"""The Ray actors behind a worker group's ranks: requesting them on a pool, waiting for them to start, and
finding the actors of a detached group again by name.

`RayWorkerGroup` (worker_group.py) owns the handles these functions create or find; this module holds no state.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.errors import WorkerGroupError
from single_controller.ray.actor_env import actor_runtime_env, check_user_env, rank_env
from single_controller.ray.class_with_args import RayClassWithInitArgs
from single_controller.ray.placement import preset_master_addr
from single_controller.ray.resource_pool import RayResourcePool
from single_controller.ray.waiting import wait_for_outputs
from single_controller.worker import (
    ENV_MASTER_ADDR,
    ENV_MASTER_RENDEZVOUS,
    ENV_RESERVE_MASTER_PORT,
    MASTER_WAIT_TIMEOUT_S,
    NodeInfo,
)

DETACHED_NAMESPACE = "single_controller"
INIT_TIMEOUT_S = MASTER_WAIT_TIMEOUT_S  # one bound on a rank's start, driver and worker side


def actor_name(name_prefix: str, rank: int) -> str:
    """The Ray actor name of one rank of a detached group (in `DETACHED_NAMESPACE`)."""
    return f"{name_prefix}_{rank}"


def request_rank_actors(
    workers: list[Any],
    group_name: str,
    pool: RayResourcePool,
    cia: RayClassWithInitArgs,
    user_env: dict[str, str],
    rendezvous: str,
    detached: bool,
) -> None:
    """Requests every rank at once into `workers` (their imports overlap; after a failure part-way
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
        env = rank_env(rank, world_size, slot, group_name)
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
        if detached:
            options.update(
                name=actor_name(group_name, rank), namespace=DETACHED_NAMESPACE, lifetime="detached"
            )
        workers.append(remote_cls.options(**options).remote(*cia.args, **cia.kwargs))


def wait_for_rank0(group_name: str, rank0: Any) -> None:
    """Returns once rank 0 has finished __init__; raises an error naming rank 0 if it failed or hung."""
    try:
        ray.get(rank0.sc_master_address.remote(), timeout=INIT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise WorkerGroupError(
            group_name, "__init__", [0],
            f"rank 0 did not finish __init__ within {INIT_TIMEOUT_S:.0f}s",
        ) from None
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
        raise WorkerGroupError(group_name, "__init__", [0], f"rank 0 failed to start:\n{error}") from None


def fetch_node_info(group_name: str, workers: list[Any]) -> list[NodeInfo]:
    """Where each rank runs (node, IP, pid), in rank order."""
    refs = [w.sc_node_info.remote() for w in workers]
    return wait_for_outputs(
        refs, list(range(len(refs))), group_name, "__init__", lambda r: f"rank {r}", INIT_TIMEOUT_S
    )


def find_detached_actors(name_prefix: str) -> list[Any]:
    """Every rank's actor of the detached group `name_prefix`, in rank order; LookupError if it is not alive."""
    try:
        rank0 = ray.get_actor(actor_name(name_prefix, 0), namespace=DETACHED_NAMESPACE)
    except ValueError:
        raise LookupError(
            f"no detached worker group named {name_prefix!r} is alive (looked for actor "
            f"{actor_name(name_prefix, 0)!r} in namespace {DETACHED_NAMESPACE!r})"
        ) from None
    world_size = ray.get(rank0.sc_world_size.remote())
    return [rank0] + [
        ray.get_actor(actor_name(name_prefix, r), namespace=DETACHED_NAMESPACE) for r in range(1, world_size)
    ]
