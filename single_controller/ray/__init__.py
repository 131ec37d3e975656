"""Ray backend: resource pools, worker groups, colocated roles."""

from single_controller.ray.class_with_args import RayClassWithInitArgs
from single_controller.ray.colocated import (
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from single_controller.ray.object_store import parallel_put
from single_controller.ray.resource_pool import RayResourcePool
from single_controller.ray.worker_group import RayWorkerGroup, spawn_roles

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "parallel_put",
    "spawn_roles",
]
