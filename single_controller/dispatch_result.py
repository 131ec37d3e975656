"""Turn what a dispatch function returned into per-rank argument lists, accepting the two usual shapes.

  * `(args, kwargs)`: a tuple of per-argument lists and a dict of per-keyword lists, each list holding one
    entry per rank (the shape the built-in modes return).
  * one entry per rank for the method's single argument: a list or tuple of length world_size, e.g.
    `return data.chunk(worker_group.world_size)`.

A 2-element result whose first element is a list/tuple and second a dict is read as `(args, kwargs)`, so a
per-rank list at world size 2 is only misread if rank 0's entry is a list and rank 1's a dict.
Anything else raises one `DispatchError` naming the method, the function, what it returned and both shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable

from single_controller.errors import DispatchError


def _function_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or repr(fn)


def _describe(value: Any) -> str:
    kind = type(value).__name__
    return f"{kind} of length {len(value)}" if isinstance(value, (list, tuple, dict)) else kind


def _is_args_kwargs(result: Any) -> bool:
    return (
        isinstance(result, (tuple, list))
        and len(result) == 2
        and isinstance(result[0], (tuple, list))
        and isinstance(result[1], Mapping)
    )


def per_rank_arguments(
    result: Any,
    world_size: int,
    where: str,
    dispatch_fn: Callable[..., Any],
    call_args: tuple,
    call_kwargs: dict,
) -> tuple[tuple[list, ...], dict[str, list]]:
    """`(args, kwargs)` with one list of `world_size` entries per argument, from a dispatch function's result.

    `where` names the method ("group.method"); `call_args` / `call_kwargs` are what the driver passed.
    """

    def fail(what: str) -> DispatchError:
        return DispatchError(
            f"the dispatch function {_function_name(dispatch_fn)} of {where} returned {what}. Return either one "
            f"entry per worker for the method's single argument (a list or tuple of length {world_size}, e.g. "
            f"data.chunk({world_size})) or (args, kwargs) in which every value is a list of length {world_size}"
        )

    def per_rank(name: Any, value: Any) -> list:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise fail(f"(args, kwargs) whose argument {name!r} is {_describe(value)}")
        return list(value)

    if _is_args_kwargs(result):
        args, kwargs = result
        return tuple(per_rank(i, a) for i, a in enumerate(args)), {k: per_rank(k, v) for k, v in kwargs.items()}
    if isinstance(result, (list, tuple)) and len(result) == world_size:
        passed = len(call_args) + len(call_kwargs)
        if passed != 1:
            raise fail(
                f"{_describe(result)}, one entry per worker for a single argument, but the call passed {passed} "
                "arguments; return (args, kwargs) to pass them all"
            )
        if call_kwargs:
            (name,) = call_kwargs
            return (), {name: list(result)}
        return (list(result),), {}
    raise fail(_describe(result))
