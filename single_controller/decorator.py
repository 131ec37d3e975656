"""`@register`: declares how a worker method is split across a group and how results come back."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from single_controller.dispatch import validate_dispatch_mode
from single_controller.errors import DispatchError
from single_controller.modes import Dispatch, DispatchMode, Execute
from single_controller.shards import run_with_resolved_shards, run_with_resolved_shards_async

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Dispatch", "DispatchMode", "Execute", "MethodSpec", "SPEC_ATTRIBUTE", "get_method_spec", "register"]


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` recorded about one worker method."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool


# The one attribute name under which the spec is stored on the decorated function.
SPEC_ATTRIBUTE = "__single_controller_spec__"


def get_method_spec(func: Any) -> MethodSpec | None:
    """Return the spec `@register` attached to `func`, or None for plain methods."""
    return getattr(func, SPEC_ATTRIBUTE, None)


def register(
    dispatch_mode: DispatchMode = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
) -> Callable[[F], F]:
    """Mark a `Worker` method as callable from the driver through a worker group.

    On the worker the wrapped method first resolves what the dispatcher sent (padded shards, futures
    handed over from another group), calls the method, then strips padding rows from its output. An
    `async def` method stays a coroutine function (Ray runs the actor as an async actor and awaits it); the
    driver calls it like any other and gets its result.
    """
    validate_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise DispatchError(f"execute_mode must be one of {[m.name for m in Execute]}, got {execute_mode!r}")
    if dispatch_mode == Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = MethodSpec(dispatch_mode=dispatch_mode, execute_mode=execute_mode, blocking=bool(blocking))

    def decorator(func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
                return await run_with_resolved_shards_async(func, self, args, kwargs)

        else:

            @functools.wraps(func)
            def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
                return run_with_resolved_shards(func, self, args, kwargs)

        setattr(inner, SPEC_ATTRIBUTE, spec)
        return inner  # type: ignore[return-value]

    return decorator
