"""A worker exception, a killed actor and a stuck call each give a clear error on the driver, never a hang."""

import time

import pytest
import ray

from single_controller import WorkerCallTimeout, WorkerDiedError, WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from tests.single_controller.actor_death import dies_within
from tests.single_controller.workers import EchoWorker


def test_worker_exception_names_group_method_rank_and_traceback(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="faulty")
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as info:
        group.fail_on_rank(1)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "'faulty'" in message and "'fail_on_rank'" in message and "[1]" in message
    assert "deliberate failure on rank 1" in message and 'File "' in message  # the remote traceback
    assert "\x1b[" not in message
    assert info.value.ranks == [1]
    assert group.fail_on_rank(5) == [0, 1]  # the group still works afterwards


def test_killed_actor_gives_clear_error_not_hang(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="doomed")
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.exit_on_rank(0)
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert "'doomed'" in message and "'exit_on_rank'" in message and "died" in message
    assert info.value.ranks == [0]
    # Calling the dead group again fails fast with the same kind of error.
    with pytest.raises(WorkerDiedError):
        group.whoami()


def test_actor_killed_from_outside(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="victim")
    ray.kill(group.workers[1], no_restart=True)
    # ray.kill is asynchronous (a call sent right after it may still be served): wait until Ray reports the
    # actor dead, so the call below cannot race it.
    assert dies_within(group.workers[1], 30.0), "the actor still answers 30 s after ray.kill"
    with pytest.raises(WorkerDiedError, match=r"rank 1"):
        group.whoami()


def test_call_timeout_names_the_stuck_ranks(cpu_pool_2):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="slow", call_timeout_s=1.0)
    with pytest.raises(WorkerCallTimeout, match=r"no result after 1s"):
        group.sleep(5)
    group.kill()
