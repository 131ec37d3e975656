"""Waiting for a group's outputs: fail fast on the first error, report every failed rank, never hang."""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError, RayTaskError

from single_controller.errors import WorkerCallTimeout, WorkerDiedError, WorkerGroupError

# While some ranks still run, the finished ones are checked for errors this often: a failure reaches
# the driver within this interval even when the other ranks hang (e.g. in a collective with it).
POLL_INTERVAL_S = 0.25
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours task names in error text
# After the first failure, how long to wait for the other ranks' failures before raising.
FAILURE_GRACE_S = 0.5


def _failures(refs: list[ray.ObjectRef], rank_of: dict[ray.ObjectRef, int]) -> dict[int, BaseException]:
    failures = {}
    for ref in refs:
        try:
            ray.get(ref)
        except (RayTaskError, RayActorError) as error:
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
) -> list[Any]:
    """Return the outputs of `refs` (one per rank in `ranks`), or raise naming what failed where.

    `recent_calls(rank)` lists the methods last sent to that rank's actor (this call included); a dead
    actor's error quotes them, since the death may have happened after the previous call finished.
    `on_ready()` runs once every rank has finished, before the outputs are fetched.
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
            unfinished = sorted(rank_of[r] for r in running)
            raise report(group, method, _failures(ready, rank_of), unfinished, describe_rank)
        if deadline is not None and time.monotonic() >= deadline:
            stuck = sorted(rank_of[r] for r in running)
            raise WorkerCallTimeout(
                group, method, stuck, f"no result after {timeout_s:g}s from " + ", ".join(map(describe_rank, stuck))
            )
    if on_ready is not None:
        on_ready()
    try:
        return ray.get(refs)
    except (RayTaskError, RayActorError):
        raise report(group, method, _failures(refs, rank_of), [], describe_rank) from None


def _failure_error(
    group: str,
    method: str,
    failures: dict[int, BaseException],
    unfinished: list[int],
    describe_rank: Callable[[int], str],
    recent_calls: Callable[[int], list[str]],
) -> WorkerGroupError:
    parts = []
    died = False
    for rank in sorted(failures):
        error = failures[rank]
        if isinstance(error, RayActorError):
            died = True
            parts.append(f"--- {describe_rank(rank)}: {_death_summary(method, recent_calls(rank))} ---\n{error}")
        else:
            parts.append(f"--- {describe_rank(rank)} raised ---\n{error}")
    if unfinished:
        parts.append(
            f"(ranks {unfinished} had not finished {FAILURE_GRACE_S:g}s after the first failure; they may be "
            "blocked in a collective with the failed rank)"
        )
    if died:
        parts.append(DEATH_ADVICE)
    error_type = WorkerDiedError if died else WorkerGroupError
    return error_type(group, method, sorted(failures), _ANSI_ESCAPE.sub("", "\n".join(parts)))


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
