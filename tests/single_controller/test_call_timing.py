"""Measured call overhead: driver wall time per call, worker time inside the method, matched per call."""

import time

import pytest

from single_controller.call_timing import DriverCall, overhead_seconds, pop_driver_calls
from single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from tests.single_controller.workers import EchoWorker


def test_overhead_matches_calls_to_each_ranks_records_in_order():
    calls = [
        DriverCall("g", "a", (0, 1), 1.0),
        DriverCall("g", "b", (0,), 0.5),  # rank zero only
        DriverCall("other", "x", (0,), 9.0),  # a group we have no records of: ignored
        DriverCall("g", "a", (0, 1), 2.0),
    ]
    records = {"g": [[("a", 0.6), ("b", 0.4), ("a", 1.5)], [("a", 0.9), ("a", 1.2)]]}
    result = overhead_seconds(calls, records)
    assert result["calls_s"] == pytest.approx(3.5)
    assert result["worker_s"] == pytest.approx(0.9 + 0.4 + 1.5)  # the slowest rank of each call
    assert result["overhead_s"] == pytest.approx(3.5 - 2.8)


def test_a_real_group_call_is_timed_on_both_sides(ray_cluster, cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="timed")
    try:
        pop_driver_calls()
        group.execute_all("sc_pop_exec_seconds")
        group.sleep(0.3)
        group.add_rank([1, 2])
        calls = pop_driver_calls()
        assert [(c.group, c.method, c.ranks) for c in calls] == [(group.name, "sleep", (0, 1)), (group.name, "add_rank", (0, 1))]
        records = group.execute_all("sc_pop_exec_seconds")
        assert [[m for m, _ in rank] for rank in records] == [["sleep", "add_rank"]] * 2
        assert all(0.3 <= rank[0][1] < 1.0 for rank in records)
        result = overhead_seconds(calls, {group.name: records})
        assert result["worker_s"] >= 0.3
        assert 0.0 <= result["overhead_s"] < result["calls_s"]
        assert group.execute_all("sc_pop_exec_seconds") == [[], []]  # popped
    finally:
        group.kill()


def test_a_non_blocking_call_counts_only_the_wait_as_worker_time():
    records = {"g": [[("gen", 2.0), ("upd", 1.0)]]}
    # Fetched after the driver did 1.9 s of other work: 0.1 s of the get waited for the worker.
    calls = [DriverCall("g", "upd", (0,), 1.05), DriverCall("g", "gen", (0,), 0.15, waited_s=0.1)]
    result = overhead_seconds(calls, records)
    assert result["worker_s"] == pytest.approx(1.0 + 0.1)
    assert result["overhead_s"] == pytest.approx(0.05 + 0.05)


def test_records_of_untimed_calls_do_not_shift_the_match():
    # "recv" was a non-blocking call whose result the driver never fetched: no DriverCall for it.
    records = {"g": [[("recv", 0.5), ("gen", 3.0)]]}
    result = overhead_seconds([DriverCall("g", "gen", (0,), 3.1)], records)
    assert result["worker_s"] == pytest.approx(3.0)
    assert result["overhead_s"] == pytest.approx(0.1)


def test_a_fetched_non_blocking_call_is_timed(ray_cluster, cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="timed_async")
    try:
        group.execute_all("sc_pop_exec_seconds")
        pop_driver_calls()
        group.sleep_async(0.2)  # never fetched
        future = group.sleep_async(0.4)
        time.sleep(0.8)  # the driver's own work while the workers sleep
        assert future.get() == [0.4, 0.4]
        group.sleep(0.3)
        calls = pop_driver_calls()
        assert [(c.method, c.waited_s is not None) for c in calls] == [("sleep_async", True), ("sleep", False)]
        assert calls[0].waited_s < 0.2  # both workers had finished (0.2 + 0.4 s) before the get
        result = overhead_seconds(calls, {group.name: group.execute_all("sc_pop_exec_seconds")})
        assert 0.3 <= result["worker_s"] < 0.3 + 0.2 + 0.2
        assert 0.0 <= result["overhead_s"] < 0.25
    finally:
        group.kill()
