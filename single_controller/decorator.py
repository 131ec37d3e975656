"""`@register`: declares how a worker method is split across a group and how results come back."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Dispatch(str, Enum):
    """Built-in dispatch modes; each names one row of the dispatch table (see `dispatch.py`)."""

    ONE_TO_ALL = "one_to_all"  # every worker gets the same arguments; outputs as a list per rank
    ALL_TO_ALL = "all_to_all"  # arguments are lists with one entry per rank; outputs as a list
    DP_COMPUTE = "dp_compute"  # like ALL_TO_ALL, for data-parallel methods taking pre-split lists
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split over workers (auto-padded), outputs concatenated
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto split over workers, outputs kept as a list (metrics)
    RANK_ZERO = "rank_zero"  # only rank 0 is called; its output is returned
    SPLIT_JOIN = "split_join"  # NeedParallel arguments split, outputs re-joined in order


class Execute(str, Enum):
    """Which ranks a call reaches."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


# A dispatch mode is a built-in `Dispatch`, the name of a mode added with `register_dispatch_mode`,
# or a custom {"dispatch_fn": f, "collect_fn": g} dict.
DispatchMode = Dispatch | str | Mapping[str, Callable[..., Any]]


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
    handed over from another group), calls the method, then strips padding rows from its output.
    """
    from single_controller.dispatch import validate_dispatch_mode  # late: dispatch imports this module

    validate_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise ValueError(f"execute_mode must be one of {[m.name for m in Execute]}, got {execute_mode!r}")
    if dispatch_mode == Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = MethodSpec(dispatch_mode=dispatch_mode, execute_mode=execute_mode, blocking=bool(blocking))

    def decorator(func: F) -> F:
        from single_controller.shards import run_with_resolved_shards

        @functools.wraps(func)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            return run_with_resolved_shards(func, self, args, kwargs)

        setattr(inner, SPEC_ATTRIBUTE, spec)
        return inner  # type: ignore[return-value]

    return decorator
