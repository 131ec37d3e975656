"""The environment variables of each worker actor: the group's own, plus the user's (verl's `worker_env`).

Every rank gets torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR /
MASTER_PORT) and the names verl's workers read: RAY_LOCAL_WORLD_SIZE (processes of the group on the node),
RAY_LOCAL_RANK (this process's place among them), WG_PREFIX (the group's name) and WG_BACKEND ("ray").
User variables come from `RayWorkerGroup(..., worker_env={...})` (verl's keyword) or from
`RayClassWithInitArgs.update_options({"runtime_env": {"env_vars": {...}}})`; neither may set a variable the
group sets, since overriding one would break rank numbering or the rendezvous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from single_controller import worker as worker_env
from single_controller.ray.resource_pool import RankSlot

ENV_RAY_LOCAL_RANK = "RAY_LOCAL_RANK"
ENV_RAY_LOCAL_WORLD_SIZE = "RAY_LOCAL_WORLD_SIZE"
ENV_WG_PREFIX = "WG_PREFIX"
ENV_WG_BACKEND = "WG_BACKEND"

# Set (or, for MASTER_PORT, reserved) by the group on every rank: user environments may not override them.
PROTECTED_ENV = frozenset(
    {
        worker_env.ENV_RANK,
        worker_env.ENV_WORLD_SIZE,
        worker_env.ENV_LOCAL_RANK,
        worker_env.ENV_LOCAL_WORLD_SIZE,
        worker_env.ENV_MASTER_ADDR,
        worker_env.ENV_MASTER_PORT,
        worker_env.ENV_RESERVE_MASTER_PORT,
        worker_env.ENV_MASTER_RENDEZVOUS,
        worker_env.ENV_GROUP_NAME,
        ENV_RAY_LOCAL_RANK,
        ENV_RAY_LOCAL_WORLD_SIZE,
        ENV_WG_PREFIX,
        ENV_WG_BACKEND,
    }
)


def rank_env(rank: int, world_size: int, slot: RankSlot, group_name: str) -> dict[str, str]:
    """The variables the group sets on one rank (the master address is added by the caller)."""
    return {
        worker_env.ENV_RANK: str(rank),
        worker_env.ENV_WORLD_SIZE: str(world_size),
        worker_env.ENV_LOCAL_RANK: str(slot.local_rank),
        worker_env.ENV_LOCAL_WORLD_SIZE: str(slot.local_world_size),
        worker_env.ENV_GROUP_NAME: group_name,
        ENV_RAY_LOCAL_RANK: str(slot.local_rank),
        ENV_RAY_LOCAL_WORLD_SIZE: str(slot.local_world_size),
        ENV_WG_PREFIX: group_name,
        ENV_WG_BACKEND: "ray",
    }


def check_user_env(env: Mapping[str, Any] | None, where: str) -> dict[str, str]:
    """The user's variables as a dict of str, refusing names the group sets and non-string values."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"{where} must be a dict of environment variables, got {type(env).__name__}")
    clash = sorted(set(env) & PROTECTED_ENV)
    if clash:
        raise ValueError(
            f"{where} cannot override protected system env {clash}: the worker group sets them on every rank "
            f"(protected: {sorted(PROTECTED_ENV)})"
        )
    bad = {k: type(v).__name__ for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise TypeError(f"{where}: environment variable names and values must be str, got {bad}")
    return dict(env)


def actor_runtime_env(
    runtime_env: Mapping[str, Any] | None, user_env: Mapping[str, str], system_env: Mapping[str, str]
) -> dict[str, Any]:
    """The actor's runtime_env: the user's options with env_vars = user runtime_env vars + worker_env + group's."""
    merged = dict(runtime_env or {})
    merged["env_vars"] = {**merged.get("env_vars", {}), **user_env, **system_env}
    return merged
