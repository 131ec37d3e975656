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


_DRIVER_CALLS: deque[DriverCall] = deque(maxlen=MAX_RECORDS)


def record_driver_call(group: str, method: str, ranks: list[int], started: float) -> None:
    _DRIVER_CALLS.append(DriverCall(group, method, tuple(ranks), time.perf_counter() - started))


def pop_driver_calls() -> list[DriverCall]:
    """The blocking calls made since the last pop, in order (non-blocking calls are not timed)."""
    calls = list(_DRIVER_CALLS)
    _DRIVER_CALLS.clear()
    return calls


def overhead_seconds(calls: list[DriverCall], exec_by_rank: dict[str, list[list[tuple[str, float]]]]) -> dict[str, float]:
    """Per call: driver wall time minus the slowest rank's time inside the method. `exec_by_rank[group]`
    holds each rank's `(method, seconds)` records in call order (actor calls run in submission order).
    Returns the summed call time, worker time and overhead."""
    cursors = {group: [0] * len(ranks) for group, ranks in exec_by_rank.items()}
    total = worker = 0.0
    for call in calls:
        records = exec_by_rank.get(call.group)
        if records is None:
            continue
        slowest = 0.0
        for rank in call.ranks:
            position = cursors[call.group][rank]
            if position < len(records[rank]) and records[rank][position][0] == call.method:
                slowest = max(slowest, records[rank][position][1])
                cursors[call.group][rank] += 1
        total += call.seconds
        worker += slowest
    return {"calls_s": total, "worker_s": worker, "overhead_s": total - worker}
