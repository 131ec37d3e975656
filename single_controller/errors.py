"""Errors a driver sees when a worker-group call goes wrong; each names the group, method and ranks."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """A worker method raised: the message holds the group, method, failing ranks and remote tracebacks."""

    def __init__(self, group: str, method: str, ranks: list[int], details: str) -> None:
        self.group, self.method, self.ranks = group, method, ranks
        super().__init__(f"worker group {group!r}, method {method!r} failed on rank(s) {ranks}:\n{details}")


class WorkerDiedError(WorkerGroupError):
    """A worker actor died (killed, OOM-killed, its node lost) before or during a call."""


class NodeLostError(WorkerDiedError):
    """A node holding ranks of the group died: `lost_nodes` maps each lost node's id to the ranks it held."""

    def __init__(
        self, group: str, method: str, ranks: list[int], details: str, lost_nodes: dict[str, list[int]]
    ) -> None:
        self.lost_nodes = lost_nodes
        super().__init__(group, method, ranks, details)


class WorkerCallTimeout(WorkerGroupError):
    """A call did not finish within the timeout given to the worker group."""


class DispatchError(ValueError, AssertionError):
    """A dispatch mode or a dispatch function's result is not usable (also an AssertionError, so code that
    catches the assertion failures of verl-style dispatch checks keeps working)."""


class MeshNotDeclaredError(LookupError, AssertionError):
    """A method dispatched over a mesh ran before a worker declared (or registered) its place in it."""

