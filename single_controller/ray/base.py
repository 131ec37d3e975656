"""verl's `single_controller.ray.base` import path: the Ray backend's public names in one module."""

from single_controller.ray import *  # noqa: F403 (the names listed in single_controller.ray's __all__)
from single_controller.ray import __all__  # noqa: F401
