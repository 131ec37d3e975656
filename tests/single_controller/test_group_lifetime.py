"""A worker group that its driver drops without `kill()` ends with the last reference to it, as a Ray actor does:
its workers run their `close` and exit, and a pool that no group uses any more gives its placement back. None of it
may wait for Python's cyclic collector (a long driver loop rarely runs it, and a Ray task's process keeps it all)."""

from __future__ import annotations

import gc
import os
import time

import pytest
from ray.util.placement_group import PlacementGroup, placement_group_table

from single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from tests.single_controller.workers import ClosingWorker

WAIT_S = 30.0


@pytest.fixture
def no_cyclic_collection():
    """Only reference counting may end the group: the collector would hide a reference cycle."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _until(condition, seconds: float = WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _removed(pg: PlacementGroup) -> bool:
    return placement_group_table(pg)["state"] == "REMOVED"


def _start_and_drop(folder: str) -> tuple[list[int], list[PlacementGroup]]:
    """A two-rank group on a pool of its own, used once; both go out of scope when this returns."""
    pool = RayResourcePool([2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ClosingWorker, folder=folder), name_prefix="dropped")
    assert group.whoami() == [0, 1]
    return [info.pid for info in group.node_info], pool.placement_groups()


def test_a_dropped_group_ends_its_workers_and_gives_its_placement_back(ray_cluster, tmp_path, no_cyclic_collection):
    pids, placement_groups = _start_and_drop(str(tmp_path))
    assert _until(lambda: not any(_process_alive(pid) for pid in pids)), f"workers {pids} outlived their group"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker_0", "worker_1"]  # each ran its close hook
    assert _until(lambda: all(_removed(pg) for pg in placement_groups)), "the dropped pool kept its placement group"


def test_the_pool_stays_while_a_group_or_a_role_view_uses_it(ray_cluster, tmp_path, no_cyclic_collection):
    fused = create_colocated_worker_cls({
        "actor": RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path), role="actor"),
        "ref": RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path), role="ref"),
    })
    pool = RayResourcePool([1], use_gpu=False)
    placement = pool.placement_groups()
    group = RayWorkerGroup(pool, fused, name_prefix="views")
    pid = group.node_info[0].pid
    views = group.spawn()
    del pool, group  # the role views are all that is left
    time.sleep(1.0)
    assert not _removed(placement[0]) and _process_alive(pid), "the views' actors lost their placement"
    assert views["actor"].whoami() == [0] and views["ref"].whoami() == [0]
    del views
    assert _until(lambda: not _process_alive(pid) and _removed(placement[0]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor_0", "ref_0"]


def test_a_closed_then_dropped_group_closes_once_and_its_kept_method_names_it(
    cpu_pool_2, tmp_path, no_cyclic_collection
):
    group = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(ClosingWorker, folder=str(tmp_path)), name_prefix="kept")
    pids = [info.pid for info in group.node_info]
    whoami = group.whoami
    assert group.close() == []
    del group
    assert _until(lambda: not any(_process_alive(pid) for pid in pids))
    assert [(tmp_path / f"worker_{rank}").read_text().splitlines() for rank in (0, 1)] == [[str(pid)] for pid in pids]
    with pytest.raises(ReferenceError, match=r"kept\.whoami was called after its RayWorkerGroup was dropped"):
        whoami()
