"""verl's `single_controller.base.decorator` import path: register, the modes and the dispatch registry."""

from single_controller.decorator import register
from single_controller.dispatch import register_dispatch_mode, update_dispatch_mode
from single_controller.dispatch_registry import (
    DISPATCH_MODE_FN_REGISTRY,
    get_predefined_dispatch_fn,
    make_nd_compute_dataproto_dispatch_fn,
)
from single_controller.modes import Dispatch, Execute

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "Dispatch",
    "Execute",
    "get_predefined_dispatch_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
