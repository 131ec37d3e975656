"""`RayWorkerGroup.close`: every rank's `Worker.close` (each role of a colocated actor) before `kill`, which runs no
code in the workers; a rank that does not finish in time is reported and killed as it is."""

import time

from single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from tests.single_controller.actor_death import dies_within
from tests.single_controller.workers import ClosingWorker


def test_close_runs_every_ranks_hook_before_the_kill(cpu_pool_2, tmp_path):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path)), name_prefix="closing")
    assert group.close() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker_0", "worker_1"]
    group.kill()


def test_close_reaches_each_role_of_a_colocated_actor(cpu_pool_2, tmp_path):
    fused = create_colocated_worker_cls({
        "actor": RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path), role="actor"),
        "ref": RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path), role="ref"),
    })
    group = RayWorkerGroup(cpu_pool_2, fused, name_prefix="closing_fused")
    assert group.close() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor_0", "actor_1", "ref_0", "ref_1"]
    group.kill()


def test_a_rank_that_does_not_close_in_time_is_reported_and_killed(cpu_pool_2, tmp_path):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path), hangs=1),
                           name_prefix="closing_hang")
    started = time.monotonic()
    assert group.close(timeout_s=2.0) == [1]
    assert time.monotonic() - started < 30
    assert [p.name for p in tmp_path.iterdir()] == ["worker_0"]
    group.kill()
    for rank, worker in enumerate(group.workers):
        assert dies_within(worker, 30.0), f"rank {rank} still answers 30 s after the kill"

