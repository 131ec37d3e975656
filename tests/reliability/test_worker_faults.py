"""Worker failures reach the driver fast and say what failed where: a raising method (within a second,
while the other rank still runs), an actor SIGKILLed mid-call and one killed while idle (what the kernel's
OOM killer does), each naming group, method, rank, node, pid and the call before."""

import os
import signal
import threading
import time

import pytest

from single_controller import WorkerDiedError, WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.reliability.workers import FaultyWorker


@pytest.fixture(scope="module")
def pool(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    yield pool
    pool.release()


@pytest.fixture
def group(pool):
    group = RayWorkerGroup(pool, RayClassWithInitArgs(FaultyWorker), name_prefix="faulty")
    group.pid()  # warm: the measured calls below do not include worker start-up
    yield group
    group.kill()


def test_exception_reaches_driver_within_a_second(group):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as info:
        group.fail_or_sleep(1, 60)  # rank 0 keeps sleeping: the driver must not wait for it
    elapsed = time.monotonic() - start
    assert elapsed < 1.0, elapsed
    message = str(info.value)
    assert "worker group 'faulty', method 'fail_or_sleep' failed on rank(s) [1]" in message
    assert "ValueError: deliberate failure on rank 1" in message and 'File "' in message  # remote traceback
    assert "rank 1 (node " in message and "ranks [0] had not finished" in message


def _node_and_pid(group, rank):
    info = group.node_info[rank]
    return f"rank {rank} (node {info.node_id[:12]} {info.ip}, pid {info.pid})"


def test_actor_killed_mid_call_names_worker_node_and_method(group):
    victim = group.node_info[1].pid
    threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.sleep(60)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "worker group 'faulty', method 'sleep' failed on rank(s) [1]" in message
    assert _node_and_pid(group, 1) in message
    assert "the worker process died (noticed in 'sleep'); the call sent to it before was 'faulty.pid'" in message
    assert "out-of-memory" in message  # the advice covers OOM kills, which look the same (SIGKILL)


def test_actor_killed_while_idle_is_reported_on_the_next_call(group):
    os.kill(group.node_info[0].pid, signal.SIGKILL)
    time.sleep(1.0)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.sleep(0)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert _node_and_pid(group, 0) in message and "the call sent to it before was 'faulty.pid'" in message
