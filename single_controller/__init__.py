"""Single-controller programming model: one driver drives groups of Ray workers with plain method calls."""

from typing import Any

from single_controller.decorator import Dispatch, Execute, register
from single_controller.dispatch import register_dispatch_mode, update_dispatch_mode
from single_controller.errors import DispatchError, NodeLostError, WorkerCallTimeout, WorkerDiedError, WorkerGroupError
from single_controller.mesh import MeshDispatch, MeshPlacement
from single_controller.need_parallel import NeedParallel
from single_controller.worker import Worker

# verl's names for the Ray classes (`from single_controller import WorkerGroup` after renaming imports),
# loaded on first use so importing this package does not import the Ray backend.
_RAY_ALIASES = {
    "WorkerGroup": "RayWorkerGroup",
    "ClassWithInitArgs": "RayClassWithInitArgs",
    "ResourcePool": "RayResourcePool",
}


def __getattr__(name: str) -> Any:
    if name in _RAY_ALIASES:
        import single_controller.ray as ray_backend

        return getattr(ray_backend, _RAY_ALIASES[name])
    raise AttributeError(f"module 'single_controller' has no attribute {name!r}")


__all__ = [
    "Dispatch",
    "DispatchError",
    "Execute",
    "MeshDispatch",
    "MeshPlacement",
    "NeedParallel",
    "NodeLostError",
    "Worker",
    "WorkerCallTimeout",
    "WorkerDiedError",
    "WorkerGroupError",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]
