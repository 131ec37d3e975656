"""`RayClassWithInitArgs`: a worker class plus the arguments its actors are constructed with."""

from __future__ import annotations

from typing import Any


def plain_class(cls: Any) -> type:
    """The user's class, also when given a `ray.remote(...)` actor class."""
    metadata = getattr(cls, "__ray_metadata__", None)
    if metadata is not None:
        # Ray subclasses the user's class; the user's class is the next in the MRO.
        return metadata.modified_class.__mro__[1]
    if not isinstance(cls, type):
        raise TypeError(f"expected a worker class (or ray.remote of one), got {cls!r}")
    return cls


class RayClassWithInitArgs:
    """Deferred construction of a worker: `RayClassWithInitArgs(MyWorker, config=cfg)`.

    `update_options` adds Ray actor options (e.g. `runtime_env`, `max_concurrency`) applied to every
    actor of the group; resources and placement are set by the resource pool.
    """

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        self.cls = plain_class(cls)
        self.args = args
        self.kwargs = kwargs
        self.actor_options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> "RayClassWithInitArgs":
        self.actor_options.update(options)
        return self

    def __repr__(self) -> str:
        return f"RayClassWithInitArgs({self.cls.__qualname__}, args={len(self.args)}, kwargs={sorted(self.kwargs)})"
