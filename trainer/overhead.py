"""The toolkit's own share of a training step, measured: time in worker-group calls that is not spent
inside the worker methods (dispatch, serialization, object transfer, scheduling, collect), plus driver time
outside the calls that is not the algorithm's own math (DataProto bookkeeping, metrics)."""

from __future__ import annotations

from typing import Any

from single_controller.call_timing import overhead_seconds, pop_driver_calls


def reset_call_logs(roles: Any) -> None:
    """Drop what earlier calls left in the logs, so the next `step_overhead` covers one step."""
    pop_driver_calls()
    roles.pop_exec_seconds()


def step_overhead(step_s: float, roles: Any, algorithm_s: float) -> dict[str, float]:
    """`algorithm_s`: driver time spent on the algorithm itself (rule rewards, advantages)."""
    calls = overhead_seconds(pop_driver_calls(), roles.pop_exec_seconds())
    driver_s = max(0.0, step_s - calls["calls_s"] - algorithm_s)
    toolkit_s = calls["overhead_s"] + driver_s
    return {
        "overhead/calls_s": calls["calls_s"],
        "overhead/in_workers_s": calls["worker_s"],
        "overhead/dispatch_collect_s": calls["overhead_s"],
        "overhead/driver_s": driver_s,
        "overhead/toolkit_s": toolkit_s,
        "overhead/toolkit_share": toolkit_s / step_s if step_s > 0 else 0.0,
    }
