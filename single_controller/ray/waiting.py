"""Waiting for a group's outputs: fail fast on the first error, report every failed rank, never hang."""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from single_controller.errors import NodeLostError, WorkerCallTimeout, WorkerDiedError, WorkerGroupError
from single_controller.ray.node_loss import LostNode, find_lost_nodes, node_may_be_lost, wait_for_lost_nodes
from single_controller.worker import NodeInfo

# While some ranks still run, the finished ones are checked for errors this often: a failure reaches
# the driver within this interval even when the other ranks hang (e.g. in a collective with it).
POLL_INTERVAL_S = 0.25
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours task names in error text
# After the first failure, how long to wait for the other ranks' failures before raising.
FAILURE_GRACE_S = 0.5
# What fetching a rank's output can raise: its method raised, its actor died, or its output was lost after
# the method returned (the node holding it died between the call's end and the driver's fetch).
CALL_FAILURES = (RayTaskError, RayActorError, ObjectLostError)


def _failures(refs: list[ray.ObjectRef], rank_of: dict[ray.ObjectRef, int]) -> dict[int, BaseException]:
    failures = {}
    for ref in refs:
        try:
            ray.get(ref)
        except CALL_FAILURES as error:
            failures[rank_of[ref]] = error
    return failures


def wait_for_outputs(
    refs: list[ray.ObjectRef],
    ranks: list[int],
    group: str,
    method: str,
    describe_rank: Callable[[int], str],
    timeout_s: float | None = None,
    recent_calls: Callable[[int], list[str]] | None = None,
    on_ready: Callable[[], None] | None = None,
    node_info: Sequence[NodeInfo] = (),
) -> list[Any]:
    """Return the outputs of `refs` (one per rank in `ranks`), or raise naming what failed where.

    `recent_calls(rank)` lists the methods last sent to that rank's actor (this call included); a dead
    actor's error quotes them, since the death may have happened after the previous call finished.
    `on_ready()` runs once every rank has finished, before the outputs are fetched. With the group's
    `node_info`, a failure checks whether Ray lost a node of the group and names it with its ranks.
    """
    report = functools.partial(_failure_error, recent_calls=recent_calls or (lambda rank: []))
    rank_of = dict(zip(refs, ranks))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    checked: set[ray.ObjectRef] = set()
    while True:
        wait_s = POLL_INTERVAL_S if deadline is None else max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic()))
        ready, running = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        if not running:
            break
        new = [r for r in ready if r not in checked]
        checked.update(new)
        if _failures(new, rank_of):
            ray.wait(running, num_returns=len(running), timeout=FAILURE_GRACE_S)
            ready, running = ray.wait(refs, num_returns=len(refs), timeout=0)
            lost = _lost_nodes(node_info, _failures(ready, rank_of), running)
            ready, running = ray.wait(refs, num_returns=len(refs), timeout=0)
            unfinished = sorted(rank_of[r] for r in running)
            raise report(group, method, _failures(ready, rank_of), unfinished, describe_rank, lost=lost)
        if deadline is not None and time.monotonic() >= deadline:
            stuck = sorted(rank_of[r] for r in running)
            raise WorkerCallTimeout(
                group, method, stuck, f"no result after {timeout_s:g}s from " + ", ".join(map(describe_rank, stuck))
            )
    if on_ready is not None:
        on_ready()
    try:
        return ray.get(refs)
    except CALL_FAILURES:
        failures = _failures(refs, rank_of)
        raise report(group, method, failures, [], describe_rank, lost=_lost_nodes(node_info, failures, [])) from None


def _lost_nodes(
    node_info: Sequence[NodeInfo], failures: dict[int, BaseException], running: list[ray.ObjectRef]
) -> list[LostNode]:
    """The group's nodes Ray has declared dead. When ranks lost their peers or became unreachable, their
    node may be gone without Ray knowing yet: wait (bounded) for Ray to declare it."""
    if not node_info:
        return []
    lost = find_lost_nodes(node_info)
    if not lost and node_may_be_lost(list(failures.values())):
        lost = wait_for_lost_nodes(node_info, running)
    return lost


def _failure_error(
    group: str,
    method: str,
    failures: dict[int, BaseException],
    unfinished: list[int],
    describe_rank: Callable[[int], str],
    recent_calls: Callable[[int], list[str]],
    lost: Sequence[LostNode] = (),
) -> WorkerGroupError:
    lost_ranks = sorted({rank for node in lost for rank in node.ranks})
    unfinished = [rank for rank in unfinished if rank not in lost_ranks]
    parts = [node.describe() for node in lost]
    died = False
    for rank in sorted(failures):
        error = failures[rank]
        if isinstance(error, RayActorError):
            died = True
            parts.append(f"--- {describe_rank(rank)}: {_death_summary(method, recent_calls(rank))} ---\n{error}")
        elif isinstance(error, ObjectLostError):
            died = True
            parts.append(f"--- {describe_rank(rank)}: its output was lost after {method!r} returned ---\n{error}")
        else:
            parts.append(f"--- {describe_rank(rank)} raised ---\n{error}")
    if unfinished:
        parts.append(
            f"(ranks {unfinished} had not finished {FAILURE_GRACE_S:g}s after the first failure; they may be "
            "blocked in a collective with the failed rank)"
        )
    if died or lost:
        parts.append(DEATH_ADVICE)
    details = _ANSI_ESCAPE.sub("", "\n".join(parts))
    if lost:
        ranks = sorted(set(failures) | set(lost_ranks))
        return NodeLostError(group, method, ranks, details, {node.node_id: list(node.ranks) for node in lost})
    error_type = WorkerDiedError if died else WorkerGroupError
    return error_type(group, method, sorted(failures), details)


DEATH_ADVICE = (
    "A dead worker cannot be recovered within a run; trainer.main stops on this error, releasing its "
    "workers and placement groups, and a new run resumes from the last checkpoint (trainer.resume_mode=auto). "
    "Ray's reason is quoted above (an out-of-memory kill mentions memory: lower the micro batch sizes or "
    "sequence lengths); the worker's own log is on that node, by default under /tmp/ray/session_latest/logs."
)


def _death_summary(method: str, recent: list[str]) -> str:
    """'the worker process died (noticed in X)', plus the call sent before X when there was one."""
    earlier = recent[:-1] if recent and recent[-1].endswith(f".{method}") else recent
    summary = f"the worker process died (noticed in {method!r})"
    if earlier:
        summary += f"; the call sent to it before was {earlier[-1]!r}"
    return summary


def unfinished_ranks(refs: Sequence[ray.ObjectRef], timeout_s: float) -> list[int]:
    """The ranks (positions in `refs`) whose call had not returned within `timeout_s`, or failed; never raises."""
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    returned = set(done)
    return [rank for rank, ref in enumerate(refs) if ref not in returned or _failed(ref)]


def _failed(ref: ray.ObjectRef) -> bool:
    try:
        ray.get(ref)
    except ray.exceptions.RayError:
        return True
    return False
