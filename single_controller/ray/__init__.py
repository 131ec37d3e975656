"""Ray backend: resource pools, worker groups, colocated roles."""

from single_controller.ray.class_with_args import RayClassWithInitArgs
from single_controller.ray.colocated import create_colocated_worker_cls
from single_controller.ray.resource_pool import RayResourcePool
from single_controller.ray.worker_group import RayWorkerGroup, spawn_roles

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "spawn_roles",
]
