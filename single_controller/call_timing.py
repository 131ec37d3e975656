"""Measured cost of worker-group calls: the driver's wall time per call and each worker's time inside the
method. Their difference is what the toolkit itself costs (dispatch, serialization, transfer, scheduling,
collect); `overhead_seconds` computes it per call from the two logs.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

MAX_RECORDS = 4096  # bounded, so a loop that never pops does not grow memory


@dataclass(frozen=True)
class DriverCall:
    group: str
    method: str
    ranks: tuple[int, ...]
    seconds: float
    # A non-blocking call's driver time is its submission plus its `get()`; while the driver did other work
    # the workers ran, so only the part of the `get()` spent waiting for them (`waited_s`) can be worker time.
    # None for a blocking call, where the whole wall time can be.
    waited_s: float | None = None


_DRIVER_CALLS: deque[DriverCall] = deque(maxlen=MAX_RECORDS)


def record_driver_call(group: str, method: str, ranks: list[int], started: float) -> None:
    _DRIVER_CALLS.append(DriverCall(group, method, tuple(ranks), time.perf_counter() - started))


def record_async_call(group: str, method: str, ranks: list[int], driver_s: float, waited_s: float) -> None:
    """A non-blocking call, once its result was fetched: `driver_s` = submission + `get()`, `waited_s` = the
    part of the `get()` spent before every worker had finished."""
    _DRIVER_CALLS.append(DriverCall(group, method, tuple(ranks), driver_s, waited_s))


def pop_driver_calls() -> list[DriverCall]:
    """The calls made since the last pop, in order: blocking calls when they return, non-blocking ones when
    their result is fetched (a result handed to another group unfetched is not timed)."""
    calls = list(_DRIVER_CALLS)
    _DRIVER_CALLS.clear()
    return calls


def _take_record(records: list[tuple[str, float]], taken: set[int], method: str) -> float | None:
    """Seconds of the earliest record of `method` not matched yet (then marked matched). Matching by name,
    not position, keeps the match right when calls are logged in another order than they ran (a
    non-blocking call is logged when fetched) or not at all (a result handed on unfetched)."""
    for position, (name, seconds) in enumerate(records):
        if name == method and position not in taken:
            taken.add(position)
            return seconds
    return None


def overhead_seconds(
    calls: list[DriverCall], exec_by_rank: dict[str, list[list[tuple[str, float]]]]
) -> dict[str, float]:
    """Per call: driver wall time minus the slowest rank's time inside the method (for a non-blocking call,
    at most the time the driver waited for it). `exec_by_rank[group]` holds each rank's `(method, seconds)`
    records in the order they ran. Returns the summed call time, worker time and overhead."""
    taken = {group: [set() for _ in ranks] for group, ranks in exec_by_rank.items()}
    total = worker = 0.0
    for call in calls:
        records = exec_by_rank.get(call.group)
        if records is None:
            continue
        seconds = [_take_record(records[rank], taken[call.group][rank], call.method) for rank in call.ranks]
        slowest = max((s for s in seconds if s is not None), default=0.0)
        total += call.seconds
        worker += slowest if call.waited_s is None else min(slowest, call.waited_s)
    return {"calls_s": total, "worker_s": worker, "overhead_s": total - worker}
