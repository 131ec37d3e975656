"""Several roles (actor, ref, critic, ...) in one actor per slot, with a per-role worker-group view."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from single_controller.decorator import SPEC_ATTRIBUTE, get_method_spec
from single_controller.ray.class_with_args import RayClassWithInitArgs
from single_controller.worker import Worker

ROLE_SEPARATOR = "__"
# Worker queries the group makes per role (a role's mesh is declared on the role's own instance).
_ROLE_QUERIES = ("sc_mesh_placement", "sc_pop_exec_seconds")


def role_method_name(role: str, method: str) -> str:
    return f"{role}{ROLE_SEPARATOR}{method}"


def _as_class_with_args(value: Any) -> RayClassWithInitArgs:
    return value if isinstance(value, RayClassWithInitArgs) else RayClassWithInitArgs(value)


def _forwarder(role: str, method: str, spec: Any) -> Callable[..., Any]:
    # The role's own method is already the @register wrapper, so shards are resolved there, not here.
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.role_instances[role], method)(*args, **kwargs)

    forward.__name__ = role_method_name(role, method)
    if spec is not None:
        setattr(forward, SPEC_ATTRIBUTE, spec)
    return forward


class ColocatedWorker(Worker):
    """Base of the generated colocated classes; `role_classes` maps role name to (class, args, kwargs)."""

    role_classes: dict[str, RayClassWithInitArgs] = {}

    def __init__(self) -> None:
        super().__init__()
        self.role_instances = {
            role: cia.cls(*cia.args, **cia.kwargs) for role, cia in type(self).role_classes.items()
        }


def create_colocated_worker_cls(class_dict: Mapping[str, Any]) -> RayClassWithInitArgs:
    """Build one worker class holding every role of `class_dict` ({"actor": A, "ref": B}).

    Values are worker classes or `RayClassWithInitArgs`. Create a `RayWorkerGroup` from the result, then
    `group.spawn()` (or `spawn_roles(group)`) returns one worker-group view per role. This module only
    builds the class; the per-role views are the worker group's (single_controller/ray/worker_group.py).
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    roles = {role: _as_class_with_args(value) for role, value in class_dict.items()}
    namespace: dict[str, Any] = {"role_classes": roles}
    for role, cia in roles.items():
        if ROLE_SEPARATOR in role or not role.isidentifier():
            raise ValueError(f"role name {role!r} must be an identifier without {ROLE_SEPARATOR!r}")
        for attr in dir(cia.cls):
            spec = get_method_spec(getattr(cia.cls, attr, None))
            if spec is not None:
                namespace[role_method_name(role, attr)] = _forwarder(role, attr, spec)
        for query in _ROLE_QUERIES:
            namespace[role_method_name(role, query)] = _forwarder(role, query, None)
    generated = type("Colocated_" + "_".join(roles), (ColocatedWorker,), namespace)
    return RayClassWithInitArgs(generated)
