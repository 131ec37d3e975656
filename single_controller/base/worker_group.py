"""verl's `single_controller.base.worker_group` import path (the Ray classes are the only backend)."""

from single_controller.base import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup"]
