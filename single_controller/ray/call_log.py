"""What each rank of a worker group was last sent, for error messages about dead actors."""

from __future__ import annotations


class CallLog:
    """The last methods sent to each rank's actor, shared by every view of the same actors.

    When an actor dies, Ray only says the call in flight failed; the calls before it tell the user what
    the worker was doing (it may have died after finishing the previous call, e.g. while idle).
    """

    KEEP = 2

    def __init__(self, world_size: int) -> None:
        self._calls: list[list[str]] = [[] for _ in range(world_size)]

    def record(self, rank: int, method: str) -> None:
        calls = self._calls[rank]
        calls.append(method)
        del calls[: -self.KEEP]

    def recent(self, rank: int) -> list[str]:
        return list(self._calls[rank]) if rank < len(self._calls) else []
