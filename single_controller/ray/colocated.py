"""Several roles (actor, ref, critic, ...) in one actor per slot, with a per-role worker-group view."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from single_controller.decorator import SPEC_ATTRIBUTE, get_method_spec
from single_controller.ray.class_with_args import RayClassWithInitArgs
from single_controller.worker import Worker

ROLE_SEPARATOR = "__"
# `_fuw_execute("<role>_fwmn_<method>", ...)` calls any method (registered or not) of one role of a fused actor.
FUSED_METHOD_SEPARATOR = "_fwmn_"
FUSED_EXECUTE_METHOD = "_fuw_execute"
# Worker queries the group makes per role (a role's mesh is declared on the role's own instance).
_ROLE_QUERIES = ("sc_mesh_placement", "sc_pop_exec_seconds")


def role_method_name(role: str, method: str) -> str:
    return f"{role}{ROLE_SEPARATOR}{method}"


def _forwarder(role: str, method: str, spec: Any, is_async: bool = False) -> Callable[..., Any]:
    # The role's own method is already the @register wrapper, so shards are resolved there, not here.
    if is_async:  # an `async def` role method: the fused actor awaits it too

        async def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.role_instances[role], method)(*args, **kwargs)

    else:

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.role_instances[role], method)(*args, **kwargs)

    forward.__name__ = role_method_name(role, method)
    if spec is not None:
        setattr(forward, SPEC_ATTRIBUTE, spec)
    return forward


class ColocatedWorker(Worker):
    """Base of the generated colocated classes; `role_classes` maps role name to (class, args, kwargs).

    Inside the actor each role is an attribute (`self.actor`) and an entry of `fused_worker_dict`, which
    every role instance shares, so one role can reach another (`self.get_fused_worker_by_name("ref")`).
    """

    role_classes: dict[str, RayClassWithInitArgs] = {}

    def __init__(self) -> None:
        super().__init__()
        self.role_instances = {
            role: cia.cls(*cia.args, **cia.kwargs) for role, cia in type(self).role_classes.items()
        }
        self.fused_worker_dict = self.role_instances
        for role, instance in self.role_instances.items():
            setattr(self, role, instance)
            instance.fused_worker_dict = self.role_instances

    def _fuw_execute(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call `<role>_fwmn_<method>` on that role's instance (any method, registered or not)."""
        role, separator, method = method_name.partition(FUSED_METHOD_SEPARATOR)
        if not separator or role not in self.role_instances:
            raise ValueError(
                f"{FUSED_EXECUTE_METHOD} needs '<role>{FUSED_METHOD_SEPARATOR}<method>' with a role of "
                f"{sorted(self.role_instances)}, got {method_name!r}"
            )
        return getattr(self.role_instances[role], method)(*args, **kwargs)


def create_colocated_worker_cls(class_dict: Mapping[str, Any]) -> RayClassWithInitArgs:
    """Build one worker class holding every role of `class_dict` ({"actor": A, "ref": B}).

    Values are worker classes or `RayClassWithInitArgs`. Create a `RayWorkerGroup` from the result, then
    `group.spawn()` (or `spawn_roles(group)`) returns one worker-group view per role. This module only
    builds the class; the per-role views are the worker group's (single_controller/ray/worker_group.py).
    """
    return RayClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))


create_colocated_worker_cls_fused = create_colocated_worker_cls  # every colocated actor here is a fused one


def create_colocated_worker_raw_cls(class_dict: Mapping[str, Any]) -> type:
    """The fused worker class itself (a `ColocatedWorker` subclass), not wrapped in RayClassWithInitArgs."""
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    roles = {
        role: v if isinstance(v, RayClassWithInitArgs) else RayClassWithInitArgs(v) for role, v in class_dict.items()
    }
    namespace: dict[str, Any] = {"role_classes": roles}
    for role, cia in roles.items():
        if ROLE_SEPARATOR in role or FUSED_METHOD_SEPARATOR in role or not role.isidentifier():
            raise ValueError(
                f"role name {role!r} must be an identifier without {ROLE_SEPARATOR!r} or {FUSED_METHOD_SEPARATOR!r}"
            )
        if hasattr(ColocatedWorker, role) or role in ("role_instances", "fused_worker_dict"):
            raise ValueError(f"role name {role!r} is an attribute of the fused worker class; pick another name")
        for attr in dir(cia.cls):
            method = getattr(cia.cls, attr, None)
            spec = get_method_spec(method)
            if spec is not None:
                namespace[role_method_name(role, attr)] = _forwarder(
                    role, attr, spec, inspect.iscoroutinefunction(method)
                )
        for query in _ROLE_QUERIES:
            namespace[role_method_name(role, query)] = _forwarder(role, query, None)
    return type("Colocated_" + "_".join(roles), (ColocatedWorker,), namespace)
