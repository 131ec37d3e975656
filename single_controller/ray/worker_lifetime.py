"""What happens when a driver drops a worker group without `kill()`: its workers close, then Ray ends them.

A group and the role views spawned from it share one `WorkerLifetime`; when the last of them is dropped, every
actor is asked to run `Worker.close` (an engine's shared memory and processes go first, as `RayWorkerGroup.close`
does), and only then are the handles released, so that Ray ends the actors. The close calls are handed to the
pool: a pool that nothing holds any more removes its placement groups once they have finished, since removing a
placement group kills the actors in it at once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

import ray


class ClosingPool(Protocol):
    """What a lifetime needs of the pool its actors are placed on (the pool imports this module, not back)."""

    closing_calls: list[ray.ObjectRef]


class WorkerLifetime:
    """Holds a group's actors (and the pool they are placed on) for as long as a group or view uses them."""

    def __init__(self, actors: list[Any], pool: ClosingPool | None, close_when_dropped: bool) -> None:
        self.pool = pool  # the pool outlives the groups placed on it
        if close_when_dropped:  # not a detached group: it outlives its driver by design
            closing = pool.closing_calls if pool is not None else None
            weakref.finalize(self, _close_dropped_workers, list(actors), closing)


def _close_dropped_workers(actors: list[Any], closing: list[ray.ObjectRef] | None) -> None:
    """Asks each actor to close (a no-op for one already closed, an error kept in its reference for one already
    killed); the references go to the pool, whose placement groups wait for them."""
    if not ray.is_initialized():
        return
    calls = [actor.sc_close.remote() for actor in actors]
    if closing is not None:
        if closing:  # a long-lived pool keeps only the calls still running
            closing[:] = ray.wait(closing, num_returns=len(closing), timeout=0)[1]
        closing.extend(calls)


def remove_after_closing(groups: list[Any], closing: list[ray.ObjectRef], wait_s: float) -> None:
    """The finalizer of a dropped pool: removes its placement groups once the close calls of its dropped groups
    have finished (at most `wait_s`), in a thread of its own, since the driver dropped the pool mid-work."""
    if not ray.is_initialized():
        return
    from ray.util.placement_group import remove_placement_group

    def remove() -> None:
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=wait_s)
        if not ray.is_initialized():  # the cluster's end removed them
            return
        for pg in groups:
            remove_placement_group(pg)

    threading.Thread(target=remove, name="remove-dropped-pool", daemon=True).start()
