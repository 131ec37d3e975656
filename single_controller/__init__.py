"""Single-controller programming model: one driver drives groups of Ray workers with plain method calls."""

from single_controller.decorator import Dispatch, Execute, register
from single_controller.dispatch import register_dispatch_mode
from single_controller.errors import WorkerCallTimeout, WorkerDiedError, WorkerGroupError
from single_controller.mesh import MeshDispatch, MeshPlacement
from single_controller.need_parallel import NeedParallel
from single_controller.worker import Worker

__all__ = [
    "Dispatch",
    "Execute",
    "MeshDispatch",
    "MeshPlacement",
    "NeedParallel",
    "Worker",
    "WorkerCallTimeout",
    "WorkerDiedError",
    "WorkerGroupError",
    "register",
    "register_dispatch_mode",
]
