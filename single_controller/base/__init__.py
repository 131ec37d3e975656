"""verl's `single_controller.base` import paths, re-exported: Worker and the worker-group classes."""

from single_controller.ray.class_with_args import RayClassWithInitArgs as ClassWithInitArgs
from single_controller.ray.resource_pool import RayResourcePool as ResourcePool
from single_controller.ray.worker_group import RayWorkerGroup as WorkerGroup
from single_controller.worker import Worker

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
