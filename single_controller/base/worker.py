"""verl's `single_controller.base.worker` import path."""

from single_controller.worker import Worker

__all__ = ["Worker"]
